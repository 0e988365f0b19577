"""Curated Pallas kernels behind one API per op, with XLA references and autotuned choice."""

__all__: list[str] = []
