"""Attention: argument checks, the XLA reference, and the mask semantics every backend shares.

Semantics (the nnlib attention-function contract). q is [B, T, Hq, D], k and v are
[B, T, Hkv, D] with Hq a multiple of Hkv (query head h reads kv head h // (Hq // Hkv)). Query i may
read key j when all of these hold:

- `causal`: j <= i;
- `sliding_window=w`: i - j < w, i.e. fewer than w positions back (it bounds only the look-back,
  exactly as nnlib's default attention; with `causal` that is w keys including itself);
- `segment_ids`: both tokens are in the same segment and that segment is not 0 (0 = padding,
  which attends to nothing and is attended by nothing).

Logits are `scale * q.k` (scale defaults to 1/sqrt(D)), then `c * tanh(logits / c)` when
`logits_soft_cap=c`. A query that may read no key gets a zero output and zero gradients, never NaN.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.kernlib._src.errors import ConfigError
from jaxstack.kernlib._src.spec import spec_key

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def validate(q, k, v, segment_ids, sliding_window, logits_soft_cap) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ConfigError(
            f"attention expects q [B,T,Hq,D] and k, v [B,T,Hkv,D]; got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ConfigError(
            f"attention needs k and v of one shape [B,T,Hkv,D] matching q's B, T and D; got "
            f"q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[2] % k.shape[2]:
        raise ConfigError(
            f"num query heads {q.shape[2]} must be a multiple of num kv heads {k.shape[2]} (GQA)"
        )
    if segment_ids is not None and tuple(segment_ids.shape) != tuple(q.shape[:2]):
        raise ConfigError(
            f"segment_ids must be int [B,T]={tuple(q.shape[:2])}, got {tuple(segment_ids.shape)}"
        )
    if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
        raise ConfigError(f"sliding_window={sliding_window!r} must be a positive int or None")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ConfigError(f"logits_soft_cap={logits_soft_cap!r} must be > 0 or None")


def default_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def visible(q_pos, k_pos, q_seg, k_seg, *, causal: bool, sliding_window: int | None):
    """Boolean mask of keys a query may read (broadcasting q_* against k_*), or None if all."""
    mask = None

    def both(a, b):
        return b if a is None else jnp.logical_and(a, b)

    if causal:
        mask = both(mask, q_pos >= k_pos)
    if sliding_window is not None:
        mask = both(mask, q_pos - k_pos < sliding_window)
    if q_seg is not None:
        mask = both(mask, jnp.logical_and(q_seg == k_seg, q_seg != 0))
    return mask


def soft_cap(logits, cap: float | None):
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def reference(
    q,
    k,
    v,
    segment_ids=None,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    scale: float | None = None,
):
    """Plain XLA attention (f32 softmax); the numerical reference for every kernel."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    scale = default_scale(d, scale)
    qg = q.reshape(b, t, hkv, g, d)
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32)
    logits = soft_cap(logits * scale, logits_soft_cap)
    pos = jnp.arange(t, dtype=jnp.int32)
    q_seg = k_seg = None
    if segment_ids is not None:
        q_seg = segment_ids[:, None, None, :, None]
        k_seg = segment_ids[:, None, None, None, :]
    mask = visible(
        pos[:, None], pos[None, :], q_seg, k_seg, causal=causal, sliding_window=sliding_window
    )
    if mask is None:
        probs = jax.nn.softmax(logits, axis=-1)
    else:
        mask = jnp.broadcast_to(mask, logits.shape)
        masked = jnp.where(mask, logits, MASK_VALUE)
        row_max = jax.lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
        unnorm = jnp.where(mask, jnp.exp(masked - row_max), 0.0)
        denom = jnp.sum(unnorm, axis=-1, keepdims=True)
        probs = unnorm / jnp.where(denom == 0.0, 1.0, denom)
    out = jnp.einsum(
        "bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32
    )
    return out.reshape(b, t, hq, d).astype(q.dtype)


def spec(q, k, v, segment_ids=None, **options: Any) -> str:
    """Tuning key: shapes and dtypes, and which masking features are on (not their values)."""
    return spec_key(
        {"q": q, "k": k, "segment_ids": segment_ids},
        {
            "causal": options.get("causal", True),
            "sliding_window": options.get("sliding_window") is not None,
            "soft_cap": options.get("logits_soft_cap") is not None,
        },
    )


def example(dims: dict[str, int], dtype: str = "bfloat16", seed: int = 0):
    """Random inputs for autotuning and benchmarks: dims batch, seq, heads, kv_heads, head_dim."""
    b, t = dims.get("batch", 1), dims.get("seq", 2048)
    hq, hkv, d = dims.get("heads", 16), dims.get("kv_heads", 16), dims.get("head_dim", 128)
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (b, t, hq, d), dtype)
    k = jax.random.normal(kk, (b, t, hkv, d), dtype)
    v = jax.random.normal(kv, (b, t, hkv, d), dtype)
    return (q, k, v, None), {"causal": bool(dims.get("causal", 1))}


def timed(fn):
    """Autotuning times forward plus backward (training is what attention tuning is for)."""

    def loss(q, k, v, segment_ids):
        return jnp.sum(fn(q, k, v, segment_ids).astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))
