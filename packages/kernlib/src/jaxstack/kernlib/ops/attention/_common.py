"""Pieces the Pallas attention backends share: fitting blocks and padding to the sequence, loop
bounds, and the static options and custom-VJP wiring around their forward / backward kernels."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxstack.kernlib._src.config import clamp_block
from jaxstack.kernlib.ops.attention import base

BLOCKS = ("block_q", "block_k", "block_q_bwd", "block_k_bwd")


@dataclasses.dataclass(frozen=True)
class Static:
    """Compile-time options of one call (hashable: the custom VJP's non-differentiable arg)."""

    causal: bool
    window: int | None
    cap: float | None
    scale: float
    has_seg: bool
    group: int
    config: Any  # the backend's own Config
    interpret: bool

    @classmethod
    def create(
        cls,
        q,
        k,
        seg,
        config,
        interpret,
        causal=True,
        sliding_window=None,
        logits_soft_cap=None,
        scale=None,
    ) -> Static:
        """From `run`'s arguments: q, k [B,T,H,D] unpadded, seg the (padded) segment ids."""
        return cls(
            causal=bool(causal),
            window=None if sliding_window is None else int(sliding_window),
            cap=None if logits_soft_cap is None else float(logits_soft_cap),
            scale=base.default_scale(q.shape[3], scale),
            has_seg=seg is not None,
            group=q.shape[2] // k.shape[2],
            config=config,
            interpret=bool(interpret),
        )


def make_flash(forward, backward):
    """The differentiable attention f(q, k, v, seg, st) -> out, from a backend's kernels.

    forward(q, k, v, seg, st) -> (out, lse); backward(q, k, v, seg, out, lse, do, st) ->
    (dq, dk, dv). The backward recomputes probabilities from the saved log-sum-exp.
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
    def flash(q, k, v, seg, st: Static):
        return forward(q, k, v, seg, st)[0]

    def fwd(q, k, v, seg, st: Static):
        out, lse = forward(q, k, v, seg, st)
        return out, (q, k, v, seg, out, lse)

    def bwd(st: Static, res, do):
        q, k, v, seg, out, lse = res
        dq, dk, dv = backward(q, k, v, seg, out, lse, do, st)
        return dq, dk, dv, None

    flash.defvjp(fwd, bwd)
    return flash


def prepare(q, k, v, segment_ids, config, interpret, *, minimum, head_dim_to=None, **options):
    """What a Pallas `run` does first: every block of `config` clamped to what the sequence needs
    (at least `minimum`), T padded to a multiple of each block (and D to `head_dim_to`), and the
    call's `Static`. Returns ((q, k, v, segment_ids) padded, Static)."""
    t = q.shape[1]
    blocks = {name: clamp_block(getattr(config, name), t, minimum) for name in BLOCKS}
    cfg = dataclasses.replace(config, **blocks)
    padded = pad_sequence(q, k, v, segment_ids, math.lcm(*blocks.values()), head_dim_to)
    return padded, Static.create(q, k, padded[3], cfg, interpret, **options)


def pad_sequence(q, k, v, segment_ids, multiple: int, head_dim_to: int | None = None):
    """Pads T to a multiple (padding tokens get segment 0) and optionally D with zeros.

    Returns padded (q, k, v, segment_ids); segment_ids is created only when padding needs it.
    """
    t, d = q.shape[1], q.shape[3]
    t_pad = -t % multiple
    d_pad = 0 if head_dim_to is None else head_dim_to - d
    if t_pad or d_pad:
        widths = ((0, 0), (0, t_pad), (0, 0), (0, d_pad))
        q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
    if t_pad:
        if segment_ids is None:
            segment_ids = jnp.ones((q.shape[0], t), jnp.int32)
        segment_ids = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, t_pad)))
    elif segment_ids is not None:
        segment_ids = segment_ids.astype(jnp.int32)
    return q, k, v, segment_ids


def kv_block_range(iq, block_q: int, block_k: int, num_k_blocks: int, causal: bool, window):
    """[lo, hi) of key blocks that query block `iq` can see (traced ints)."""
    first_q = iq * block_q
    last_q = first_q + block_q - 1
    lo = 0
    if window is not None:
        lo = jnp.maximum(0, lax.div(first_q - (window - 1), block_k))
    hi = num_k_blocks
    if causal:
        hi = jnp.minimum(num_k_blocks, lax.div(last_q, block_k) + 1)
    return lo, hi


def q_block_range(ik, block_q: int, block_k: int, num_q_blocks: int, causal: bool, window):
    """[lo, hi) of query blocks that can see key block `ik` (traced ints)."""
    first_k = ik * block_k
    last_k = first_k + block_k - 1
    lo = lax.div(first_k, block_q) if causal else 0
    hi = num_q_blocks
    if window is not None:
        hi = jnp.minimum(num_q_blocks, lax.div(last_k + window - 1, block_q) + 1)
    return lo, hi


def sum_kv_groups(grad_per_q_head, num_kv_heads: int):
    """[B,T,Hq,D] gradients of per-query-head copies of k/v -> [B,T,Hkv,D]."""
    b, t, hq, d = grad_per_q_head.shape
    return grad_per_q_head.reshape(b, t, num_kv_heads, hq // num_kv_heads, d).sum(axis=3)
