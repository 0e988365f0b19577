"""Training FLOPs per token (for MFU): 6 * matmul params + the attention score/value matmuls."""

from __future__ import annotations

from jaxstack.nnlib._src.config import ModelConfig


def matmul_params_per_token(config: ModelConfig) -> int:
    """Parameters each token multiplies through (active experts only; no embedding lookup)."""
    c = config
    attn = c.d_model * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp = 3 * c.d_model * c.mlp_dim
    if c.is_moe:
        mlp = c.experts_per_token * mlp + c.d_model * c.num_experts
    return c.num_layers * (attn + mlp) + c.d_model * c.vocab_size


def training_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Forward + backward FLOPs per token: 6N + 12 * layers * seq_len * heads * head_dim.

    The attention term counts the full [T, T] score and value matmuls, which is what the
    default (masked, non-flash) attention computes; a causal flash kernel does about half.
    """
    c = config
    attention = 12 * c.num_layers * seq_len * c.num_heads * c.head_dim
    return float(6 * matmul_params_per_token(c) + attention)
