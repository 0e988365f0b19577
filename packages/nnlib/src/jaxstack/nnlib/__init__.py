"""Model authoring on Flax NNX: decoder families, MoE, LoRA, KV-cache decode, HF safetensors
interop.

    from flax import nnx
    from jaxstack import nnlib

    model = nnlib.Transformer(nnlib.get_preset("tiny"), rngs=nnx.Rngs(0))
    apply, params = nnlib.as_function(model)      # pure apply for jax.jit / jax.grad
    logits, _ = apply(params, tokens, positions, segment_ids)
"""

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.nnlib, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.attention": ["Attention"],
        "_src.attention_fn": ["AttentionFn", "dot_product_attention", "masked_attention"],
        "_src.block": ["Block"],
        "_src.cache": ["ContiguousKVCache", "KVCache"],
        "_src.config": ["ModelConfig"],
        "_src.dense": ["Dense"],
        "_src.errors": [
            "CacheError",
            "CheckpointMismatchError",
            "ConfigError",
            "Error",
            "SurgeryError",
        ],
        "_src.flops": ["training_flops_per_token"],
        "_src.functional": ["as_function"],
        "_src.generate": ["generate"],
        "_src.hf_io": ["load_hf_checkpoint", "load_hf_weights", "save_hf_checkpoint"],
        "_src.lora": [
            "apply_lora",
            "load_lora",
            "lora_state",
            "merge_lora",
            "save_lora",
            "set_lora_dropout_rng",
            "unmerge_lora",
        ],
        "_src.lora_module": ["LoRA"],
        "_src.mlp": ["GatedMLP"],
        "_src.moe": ["MoE"],
        "_src.norm": ["RMSNorm"],
        "_src.paths": ["param_path"],
        "_src.peft": ["load_peft_adapter", "read_peft_adapter"],
        "_src.presets": ["get_preset", "list_presets"],
        "_src.rope": ["apply_rope", "inverse_frequencies"],
        "_src.sharding": ["logical_axes", "partition_specs"],
        "_src.surgery": [
            "Frozen",
            "freeze",
            "init_from",
            "iter_modules",
            "replace_module",
            "unfreeze",
        ],
        "_src.transformer": ["Transformer"],
    },
)
