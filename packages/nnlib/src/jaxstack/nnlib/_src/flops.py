"""Training FLOPs per token (for MFU): 6 * matmul params + the attention score/value matmuls."""

from __future__ import annotations

from jaxstack.nnlib._src.attention_fn import SPLIT_MIN_LEN
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
    """Forward + backward FLOPs per token: 6N + 12 * layers * keys * heads * head_dim.

    The attention term counts the score and value matmuls the default (masked, non-flash)
    attention computes: the full [T, T] square, or 3/4 of it from `SPLIT_MIN_LEN` on (even T),
    where the first half of the queries meets only the first half of the keys. A causal flash
    kernel does about half the square.
    """
    c = config
    keys = seq_len * 3 / 4 if seq_len >= SPLIT_MIN_LEN and seq_len % 2 == 0 else seq_len
    attention = 12 * c.num_layers * keys * c.num_heads * c.head_dim
    return float(6 * matmul_params_per_token(c) + attention)
