"""Named configs: the project's `tiny` model, real sizes of each family, tiny test sizes."""

from __future__ import annotations

from jaxstack.nnlib._src.config import ModelConfig
from jaxstack.nnlib._src.errors import ConfigError

_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_REAL = dict(scan_layers=True, remat="full", dtype="bfloat16")
_GEMMA = dict(
    activation="gelu_tanh", norm_plus_one=True, embed_scale=True, tie_embeddings=True, norm_eps=1e-6
)
_GEMMA2 = dict(_GEMMA, sandwich_norm=True, attn_logit_soft_cap=50.0, final_logit_soft_cap=30.0)
_TINY_FAMILY = dict(
    vocab_size=256,
    d_model=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    mlp_dim=128,
    max_seq_len=128,
)


def _alternating(n: int) -> tuple[str, ...]:
    """Gemma 2's layer pattern: even layers sliding-window, odd layers global."""
    return tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n))


_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "tiny-moe": ModelConfig(family="mixtral", mlp_dim=512, num_experts=4, experts_per_token=2),
    # Tiny members of every family (tests, HF parity fixtures).
    "tiny-llama": ModelConfig(
        family="llama",
        rope_theta=500000.0,
        rope_scaling=dict(_LLAMA31_ROPE, original_max_position_embeddings=32),
        **_TINY_FAMILY,
    ),
    "tiny-mistral": ModelConfig(family="mistral", sliding_window=8, **_TINY_FAMILY),
    "tiny-qwen2": ModelConfig(family="qwen2", qkv_bias=True, norm_eps=1e-6, **_TINY_FAMILY),
    "tiny-qwen3": ModelConfig(family="qwen3", qk_norm=True, norm_eps=1e-6, **_TINY_FAMILY),
    "tiny-gemma": ModelConfig(family="gemma", **_GEMMA, **_TINY_FAMILY),
    "tiny-gemma2": ModelConfig(
        family="gemma2",
        sliding_window=8,
        layer_types=_alternating(2),
        query_pre_attn_scalar=16.0,
        **_GEMMA2,
        **_TINY_FAMILY,
    ),
    "tiny-mixtral": ModelConfig(
        family="mixtral", num_experts=4, experts_per_token=2, **_TINY_FAMILY
    ),
    # Real sizes.
    "llama3-8b": ModelConfig(
        family="llama",
        vocab_size=128256,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        max_seq_len=8192,
        rope_theta=500000.0,
        **_REAL,
    ),
    "llama3.1-8b": ModelConfig(
        family="llama",
        vocab_size=128256,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        max_seq_len=131072,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
        **_REAL,
    ),
    "mistral-7b": ModelConfig(
        family="mistral",
        vocab_size=32000,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        max_seq_len=32768,
        rope_theta=10000.0,
        sliding_window=4096,
        **_REAL,
    ),
    "qwen2-7b": ModelConfig(
        family="qwen2",
        vocab_size=152064,
        d_model=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        mlp_dim=18944,
        max_seq_len=32768,
        rope_theta=1000000.0,
        qkv_bias=True,
        norm_eps=1e-6,
        **_REAL,
    ),
    "qwen3-8b": ModelConfig(
        family="qwen3",
        vocab_size=151936,
        d_model=4096,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=12288,
        max_seq_len=40960,
        rope_theta=1000000.0,
        qk_norm=True,
        norm_eps=1e-6,
        **_REAL,
    ),
    "gemma-7b": ModelConfig(
        family="gemma",
        vocab_size=256000,
        d_model=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=16,
        head_dim=256,
        mlp_dim=24576,
        max_seq_len=8192,
        **_GEMMA,
        **_REAL,
    ),
    "gemma2-9b": ModelConfig(
        family="gemma2",
        vocab_size=256000,
        d_model=3584,
        num_layers=42,
        num_heads=16,
        num_kv_heads=8,
        head_dim=256,
        mlp_dim=14336,
        max_seq_len=8192,
        sliding_window=4096,
        layer_types=_alternating(42),
        query_pre_attn_scalar=256.0,
        **_GEMMA2,
        **dict(_REAL, scan_layers=False),
    ),
    "mixtral-8x7b": ModelConfig(
        family="mixtral",
        vocab_size=32000,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        max_seq_len=32768,
        rope_theta=1000000.0,
        num_experts=8,
        experts_per_token=2,
        **_REAL,
    ),
}


def get_preset(name: str) -> ModelConfig:
    """The ModelConfig registered under `name` (see `list_presets()`)."""
    try:
        return _PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; available: {list_presets()}") from None


def list_presets() -> list[str]:
    """The names `get_preset` accepts, sorted: the tiny test models and the published families.

    Example:
        >>> "tiny-llama" in list_presets()
        True
    """
    return sorted(_PRESETS)
