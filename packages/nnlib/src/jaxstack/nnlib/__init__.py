"""Model authoring on Flax NNX: decoder families, MoE, LoRA, KV-cache decode, HF safetensors
interop.

    from flax import nnx
    from jaxstack import nnlib

    model = nnlib.Transformer(nnlib.get_preset("tiny"), rngs=nnx.Rngs(0))
    apply, params = nnlib.as_function(model)      # pure apply for jax.jit / jax.grad
    logits, _ = apply(params, tokens, positions, segment_ids)
"""

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.nnlib, or a command's --help, does not import JAX.
_EXPORTS = {
    "Attention": "attention",
    "AttentionFn": "attention_fn",
    "dot_product_attention": "attention_fn",
    "Block": "block",
    "ContiguousKVCache": "cache",
    "KVCache": "cache",
    "ModelConfig": "config",
    "Dense": "dense",
    "CacheError": "errors",
    "CheckpointMismatchError": "errors",
    "ConfigError": "errors",
    "Error": "errors",
    "SurgeryError": "errors",
    "training_flops_per_token": "flops",
    "as_function": "functional",
    "generate": "generate",
    "load_hf_checkpoint": "hf_io",
    "load_hf_weights": "hf_io",
    "save_hf_checkpoint": "hf_io",
    "apply_lora": "lora",
    "load_lora": "lora",
    "lora_state": "lora",
    "merge_lora": "lora",
    "save_lora": "lora",
    "set_lora_dropout_rng": "lora",
    "unmerge_lora": "lora",
    "LoRA": "lora_module",
    "GatedMLP": "mlp",
    "MoE": "moe",
    "RMSNorm": "norm",
    "param_path": "paths",
    "load_peft_adapter": "peft",
    "read_peft_adapter": "peft",
    "get_preset": "presets",
    "list_presets": "presets",
    "apply_rope": "rope",
    "inverse_frequencies": "rope",
    "logical_axes": "sharding",
    "partition_specs": "sharding",
    "Frozen": "surgery",
    "freeze": "surgery",
    "init_from": "surgery",
    "iter_modules": "surgery",
    "replace_module": "surgery",
    "unfreeze": "surgery",
    "Transformer": "transformer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}._src.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
