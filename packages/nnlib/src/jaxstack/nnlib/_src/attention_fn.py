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
    """The type of a full-sequence attention function: the contract `Transformer(attention_fn=...)`
    takes and kernlib's `attention` implements.

    `fn(q, k, v, *, segment_ids=None, causal=True, sliding_window=None, logits_soft_cap=None,
    scale=None) -> out`, with q [B, T, num_heads, head_dim], k and v [B, T, num_kv_heads,
    head_dim], segment_ids [B, T] int32 (0 = padding) and out shaped like q. A query attends to a
    key only in the same non-zero segment (and not in the future when causal); padding queries
    give exactly zero. `dot_product_attention` is the plain-XLA default.
    """

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


# Causal self-attention at least this long splits its queries in two halves: the first half only
# needs the first half of the keys, which skips a quarter of the score matrix. On CPU this made
# one layer's attention forward+backward ~1.3x faster at T=256 (benchmarks/train/README.md).
SPLIT_MIN_LEN = 256


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

    Queries whose mask row is empty (padding) get a zero output, never NaN. Public for
    attention functions whose masks segment ids cannot express (they build the mask and call
    this).
    """
    b, tq, h, d = q.shape
    kv_heads = k.shape[2]
    groups = h // kv_heads
    scale = d**-0.5 if scale is None else scale
    if groups == 1:
        # Plain [B, H] batch axes: XLA:CPU copies less around these dots than with a size-1
        # group axis (one layer's attention forward+backward ~1.15x faster at T=256).
        q_, logits_spec, out_spec, m = q, "bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd", mask[:, None]
    else:
        q_ = q.reshape(b, tq, kv_heads, groups, d)
        logits_spec, out_spec = "bqkgd,bskd->bkgqs", "bkgqs,bskd->bqkgd"
        m = mask[:, None, None]
    logits = jnp.einsum(logits_spec, q_, k, preferred_element_type=jnp.float32) * scale
    if logits_soft_cap is not None:
        logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
    logits = jnp.where(m, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum(out_spec, probs, v).reshape(b, tq, h, d)
    # An empty row's softmax is uniform over masked keys; one factor per query zeroes it.
    has_keys = jnp.any(mask, axis=-1)[:, :, None, None]
    return out * has_keys.astype(out.dtype)


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
    kwargs = dict(logits_soft_cap=logits_soft_cap, scale=scale)
    if not causal or t < SPLIT_MIN_LEN or t % 2:
        return masked_attention(q, k, v, mask, **kwargs)
    half = t // 2
    first = masked_attention(q[:, :half], k[:, :half], v[:, :half], mask[:, :half, :half], **kwargs)
    second = masked_attention(q[:, half:], k, v, mask[:, half:], **kwargs)
    return jnp.concatenate([first, second], axis=1)
