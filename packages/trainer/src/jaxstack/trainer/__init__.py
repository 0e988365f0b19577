"""LLM training harness: configs, meshes, sharding, goodput, MFU."""

__all__: list[str] = []
