"""The pluggable attention function and its default, plain-XLA implementation.

Signature (the contract kernlib implements):

    attention_fn(q, k, v, *, segment_ids=None, causal=True, sliding_window=None,
                 logits_soft_cap=None, scale=None) -> out

q [B, T, num_heads, head_dim], k/v [B, T, num_kv_heads, head_dim], segment_ids [B, T] int32
(0 = padding, documents numbered from 1), out [B, T, num_heads, head_dim].

Masking rules: a query attends to a key only when both are in the same non-zero segment (and,
if causal, the key is not in the future; with a sliding window, fewer than `sliding_window`
positions back). Padding queries attend to nothing and their output is exactly zero.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp


class AttentionFn(Protocol):
    def __call__(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        causal: bool = True,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        scale: float | None = None,
    ) -> jax.Array: ...


def attention_mask(
    q_positions: jax.Array,
    k_positions: jax.Array,
    q_segments: jax.Array,
    k_segments: jax.Array,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
) -> jax.Array:
    """Boolean mask [B, Tq, Tk]: True where query i may attend to key j."""
    mask = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] != 0)
    delta = q_positions[:, :, None] - k_positions[:, None, :]
    if causal:
        mask = mask & (delta >= 0)
    if sliding_window is not None:
        mask = mask & (delta < sliding_window)
    return mask


def masked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    *,
    logits_soft_cap: float | None = None,
    scale: float | None = None,
) -> jax.Array:
    """GQA attention of q [B,Tq,H,D] over k/v [B,Tk,K,D] with mask [B,Tq,Tk]; f32 softmax.

    Queries whose mask row is empty (padding) get a zero output, never NaN.
    """
    b, tq, h, d = q.shape
    kv_heads = k.shape[2]
    groups = h // kv_heads
    scale = d**-0.5 if scale is None else scale
    qg = q.reshape(b, tq, kv_heads, groups, d)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", qg, k, preferred_element_type=jnp.float32) * scale
    if logits_soft_cap is not None:
        logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
    m = mask[:, None, None, :, :]
    logits = jnp.where(m, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = jnp.where(m, probs, 0.0).astype(v.dtype)
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v)
    return out.reshape(b, tq, h, d)


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    scale: float | None = None,
) -> jax.Array:
    """Default attention_fn: masked einsum attention that XLA fuses well on CPU/GPU/TPU."""
    b, t = q.shape[:2]
    if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = attention_mask(
        positions, positions, segment_ids, segment_ids, causal=causal, sliding_window=sliding_window
    )
    return masked_attention(q, k, v, mask, logits_soft_cap=logits_soft_cap, scale=scale)
