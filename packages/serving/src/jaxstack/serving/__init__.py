"""LLM engine and StableHLO model serving."""

__all__: list[str] = []
