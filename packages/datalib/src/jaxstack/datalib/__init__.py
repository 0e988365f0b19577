"""Deterministic, checkpointable input pipelines on Grain (no JAX dependency)."""

__all__: list[str] = []
