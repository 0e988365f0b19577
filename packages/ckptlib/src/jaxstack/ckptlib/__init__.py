"""Atomic, async, verified checkpoints of model, optimiser and data state on Orbax."""

__all__: list[str] = []
