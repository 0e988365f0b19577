"""Non-intrusive quantisation by rules on module paths: PTQ, QAT, QLoRA."""

__all__: list[str] = []
