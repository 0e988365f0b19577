"""Model authoring on Flax NNX: decoder families, MoE, LoRA, KV-cache decode, HF safetensors
interop.

    from flax import nnx
    from jaxstack import nnlib

    model = nnlib.Transformer(nnlib.get_preset("tiny"), rngs=nnx.Rngs(0))
    apply, params = nnlib.as_function(model)      # pure apply for jax.jit / jax.grad
    logits, _ = apply(params, tokens, positions, segment_ids)
"""

from jaxstack.nnlib._src.attention import Attention
from jaxstack.nnlib._src.attention_fn import AttentionFn, dot_product_attention
from jaxstack.nnlib._src.block import Block
from jaxstack.nnlib._src.cache import ContiguousKVCache, KVCache
from jaxstack.nnlib._src.config import ModelConfig
from jaxstack.nnlib._src.dense import Dense
from jaxstack.nnlib._src.errors import (
    CacheError,
    CheckpointMismatchError,
    ConfigError,
    Error,
    SurgeryError,
)
from jaxstack.nnlib._src.flops import training_flops_per_token
from jaxstack.nnlib._src.functional import as_function
from jaxstack.nnlib._src.generate import generate
from jaxstack.nnlib._src.hf_io import load_hf_checkpoint, load_hf_weights, save_hf_checkpoint
from jaxstack.nnlib._src.lora import (
    apply_lora,
    load_lora,
    lora_state,
    merge_lora,
    save_lora,
    set_lora_dropout_rng,
    unmerge_lora,
)
from jaxstack.nnlib._src.lora_module import LoRA
from jaxstack.nnlib._src.mlp import GatedMLP
from jaxstack.nnlib._src.moe import MoE
from jaxstack.nnlib._src.norm import RMSNorm
from jaxstack.nnlib._src.paths import param_path
from jaxstack.nnlib._src.presets import get_preset, list_presets
from jaxstack.nnlib._src.rope import apply_rope, inverse_frequencies
from jaxstack.nnlib._src.sharding import logical_axes, partition_specs
from jaxstack.nnlib._src.surgery import (
    Frozen,
    freeze,
    init_from,
    iter_modules,
    replace_module,
    unfreeze,
)
from jaxstack.nnlib._src.transformer import Transformer

__all__ = [
    "Attention",
    "AttentionFn",
    "Block",
    "CacheError",
    "CheckpointMismatchError",
    "ConfigError",
    "ContiguousKVCache",
    "Dense",
    "Error",
    "Frozen",
    "GatedMLP",
    "KVCache",
    "LoRA",
    "MoE",
    "ModelConfig",
    "RMSNorm",
    "SurgeryError",
    "Transformer",
    "apply_lora",
    "apply_rope",
    "as_function",
    "dot_product_attention",
    "freeze",
    "generate",
    "get_preset",
    "init_from",
    "inverse_frequencies",
    "iter_modules",
    "list_presets",
    "load_hf_checkpoint",
    "load_hf_weights",
    "load_lora",
    "logical_axes",
    "lora_state",
    "merge_lora",
    "param_path",
    "partition_specs",
    "replace_module",
    "save_hf_checkpoint",
    "save_lora",
    "set_lora_dropout_rng",
    "training_flops_per_token",
    "unfreeze",
    "unmerge_lora",
]
