"""Model authoring on Flax NNX: decoder families, MoE, LoRA, KV-cache decode, HF safetensors
interop.
"""

__all__: list[str] = []
