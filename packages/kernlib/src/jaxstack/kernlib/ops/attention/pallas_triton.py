"""Flash attention for GPUs in Pallas Triton: forward, and a two-kernel backward (dq; dk+dv).

Grid (query block, batch, query head). Each program keeps one query block's running max, sum
and accumulator in registers and walks only the key blocks the causal / sliding-window mask can
reach. Logits live in the log2 domain (`exp2` is the fast path on NVIDIA). The backward
recomputes probabilities from the saved log-sum-exp; for GQA the dk/dv kernel writes one f32
copy per query head and XLA sums each group (simple and exact; costs Hq/Hkv x dk/dv memory).

Sequence lengths are padded to the block size (padding tokens get segment 0, so they attend to
nothing) and head_dim to a power of two >= 16, as Triton tiles require.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxstack.kernlib._src.config import KernelConfig, next_power_of_two, power_of_two
from jaxstack.kernlib.ops.attention import _common, base

LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    """Tile sizes of the Triton kernels (powers of two, >= 16)."""

    block_q: int = power_of_two(64, 16)
    block_k: int = power_of_two(64, 16)
    block_q_bwd: int = power_of_two(64, 16)
    block_k_bwd: int = power_of_two(64, 16)
    num_warps: int = 4
    num_stages: int = 2
    # (block_q, block_k, block_q_bwd, block_k_bwd, num_warps, num_stages): forward tiles, then
    # backward tiles
    SWEEP = (
        (128, 64, 64, 64, 4, 2), (128, 64, 64, 64, 8, 3), (128, 128, 64, 64, 8, 2),
        (64, 128, 64, 64, 4, 3), (128, 32, 64, 64, 4, 3), (64, 64, 32, 64), (64, 64, 64, 128),
    )  # fmt: skip


_Static = _common.Static


def _logits(q, k, st: _Static):
    """Scaled, soft-capped logits in the log2 domain, plus tanh (for the soft-cap derivative)."""
    s = plgpu.dot(q, k, trans_b=True) * st.scale
    t = None
    if st.cap is not None:
        t = jnp.tanh(s / st.cap)
        s = st.cap * t
    return s * LOG2E, t


def _mask(q_pos, k_pos, q_seg, k_seg, st: _Static):
    qs = None if q_seg is None else q_seg[:, None]
    ks = None if k_seg is None else k_seg[None, :]
    return base.visible(
        q_pos[:, None], k_pos[None, :], qs, ks, causal=st.causal, sliding_window=st.window
    )


def _fwd_kernel(*refs, st: _Static, bq: int, bk: int, nk: int):
    if st.has_seg:
        q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref, lse_ref = refs
    else:
        q_ref, k_ref, v_ref, o_ref, lse_ref = refs
        qs_ref = ks_ref = None
    iq = pl.program_id(0)
    q = q_ref[...]
    q_pos = iq * bq + jnp.arange(bq, dtype=jnp.int32)
    q_seg = None if qs_ref is None else qs_ref[...]

    def body(j, carry):
        acc, m, row_sum = carry
        ks = pl.ds(j * bk, bk)
        k = k_ref[ks, :]
        v = v_ref[ks, :]
        s, _ = _logits(q, k, st)
        k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)
        mask = _mask(q_pos, k_pos, q_seg, None if ks_ref is None else ks_ref[ks], st)
        if mask is not None:
            s = jnp.where(mask, s, base.MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        if mask is not None:
            p = jnp.where(mask, p, 0.0)
        row_sum = alpha * row_sum + jnp.sum(p, axis=1)
        acc = alpha[:, None] * acc + plgpu.dot(p.astype(v.dtype), v)
        return acc, m_new, row_sum

    lo, hi = _common.kv_block_range(iq, bq, bk, nk, st.causal, st.window)
    init = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.full((bq,), base.MASK_VALUE, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    acc, m, row_sum = lax.fori_loop(lo, hi, body, init)
    empty = row_sum == 0.0
    l_safe = jnp.where(empty, 1.0, row_sum)
    o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, 0.0, m + jnp.log2(l_safe))


def _seg_specs(st: _Static, block: int, t: int, q_axis_is_grid0: bool):
    if not st.has_seg:
        return []
    del q_axis_is_grid0
    return [
        pl.BlockSpec((None, block), lambda i, b, h: (b, i)),
        pl.BlockSpec((None, t), lambda i, b, h: (b, 0)),
    ]


def _params(st: _Static):
    return plgpu.CompilerParams(num_warps=st.config.num_warps, num_stages=st.config.num_stages)


def _forward(q, k, v, seg, st: _Static):
    b, t, hq, d = q.shape
    bq, bk, g = st.config.block_q, st.config.block_k, st.group
    kernel = functools.partial(_fwd_kernel, st=st, bq=bq, bk=bk, nk=t // bk)
    in_specs = [
        pl.BlockSpec((None, bq, None, d), lambda i, bb, h: (bb, i, h, 0)),
        pl.BlockSpec((None, t, None, d), lambda i, bb, h: (bb, 0, h // g, 0)),
        pl.BlockSpec((None, t, None, d), lambda i, bb, h: (bb, 0, h // g, 0)),
        *_seg_specs(st, bq, t, True),
    ]
    out, lse = pl.pallas_call(
        kernel,
        grid=(t // bq, b, hq),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, bq, None, d), lambda i, bb, h: (bb, i, h, 0)),
            pl.BlockSpec((None, None, bq), lambda i, bb, h: (bb, h, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, hq, t), jnp.float32),
        ],
        compiler_params=_params(st),
        interpret=st.interpret,
        name="kernlib_attention_fwd",
    )(q, k, v, *([seg, seg] if st.has_seg else []))
    return out, lse


def _dq_kernel(*refs, st: _Static, bq: int, bk: int, nk: int):
    if st.has_seg:
        q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, qs_ref, ks_ref, dq_ref = refs
    else:
        q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, dq_ref = refs
        qs_ref = ks_ref = None
    iq = pl.program_id(0)
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], dl_ref[...]
    q_pos = iq * bq + jnp.arange(bq, dtype=jnp.int32)
    q_seg = None if qs_ref is None else qs_ref[...]

    def body(j, dq):
        ks = pl.ds(j * bk, bk)
        k, v = k_ref[ks, :], v_ref[ks, :]
        s, t = _logits(q, k, st)
        p = jnp.exp2(s - lse[:, None])
        k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)
        mask = _mask(q_pos, k_pos, q_seg, None if ks_ref is None else ks_ref[ks], st)
        if mask is not None:
            p = jnp.where(mask, p, 0.0)
        ds = p * (plgpu.dot(do, v, trans_b=True) - delta[:, None])
        if t is not None:
            ds = ds * (1.0 - t * t)
        return dq + plgpu.dot(ds.astype(k.dtype), k)

    lo, hi = _common.kv_block_range(iq, bq, bk, nk, st.causal, st.window)
    dq = lax.fori_loop(lo, hi, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * st.scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, st: _Static, bq: int, bk: int, nq: int):
    if st.has_seg:
        q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, qs_ref, ks_ref, dk_ref, dv_ref = refs
    else:
        q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, dk_ref, dv_ref = refs
        qs_ref = ks_ref = None
    ik = pl.program_id(0)
    k, v = k_ref[...], v_ref[...]
    k_pos = ik * bk + jnp.arange(bk, dtype=jnp.int32)
    k_seg = None if ks_ref is None else ks_ref[...]

    def body(i, carry):
        dk, dv = carry
        qsl = pl.ds(i * bq, bq)
        q, do = q_ref[qsl, :], do_ref[qsl, :]
        lse, delta = lse_ref[qsl], dl_ref[qsl]
        s, t = _logits(q, k, st)
        p = jnp.exp2(s - lse[:, None])
        q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)
        mask = _mask(q_pos, k_pos, None if qs_ref is None else qs_ref[qsl], k_seg, st)
        if mask is not None:
            p = jnp.where(mask, p, 0.0)
        dv = dv + plgpu.dot(p.astype(do.dtype), do, trans_a=True)
        ds = p * (plgpu.dot(do, v, trans_b=True) - delta[:, None])
        if t is not None:
            ds = ds * (1.0 - t * t)
        dk = dk + plgpu.dot(ds.astype(q.dtype), q, trans_a=True)
        return dk, dv

    lo, hi = _common.q_block_range(ik, bq, bk, nq, st.causal, st.window)
    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk_ref[...] = dk * st.scale
    dv_ref[...] = dv


def _backward(q, k, v, seg, out, lse, do, st: _Static):
    b, t, hq, d = q.shape
    g = st.group
    bq, bk = st.config.block_q_bwd, st.config.block_k_bwd
    delta = jnp.einsum("bthd,bthd->bht", out.astype(jnp.float32), do.astype(jnp.float32))
    row = lambda blk: pl.BlockSpec((None, blk, None, d), lambda i, bb, h: (bb, i, h, 0))
    full_q = pl.BlockSpec((None, t, None, d), lambda i, bb, h: (bb, 0, h, 0))
    full_kv = pl.BlockSpec((None, t, None, d), lambda i, bb, h: (bb, 0, h // g, 0))
    kv_row = pl.BlockSpec((None, bk, None, d), lambda i, bb, h: (bb, i, h // g, 0))
    vec = lambda blk: pl.BlockSpec((None, None, blk), lambda i, bb, h: (bb, h, i))
    full_vec = pl.BlockSpec((None, None, t), lambda i, bb, h: (bb, h, 0))
    segs = [seg, seg] if st.has_seg else []

    dq = pl.pallas_call(
        functools.partial(_dq_kernel, st=st, bq=bq, bk=bk, nk=t // bk),
        grid=(t // bq, b, hq),
        in_specs=[
            row(bq),
            full_kv,
            full_kv,
            row(bq),
            vec(bq),
            vec(bq),
            *_seg_specs(st, bq, t, True),
        ],
        out_specs=row(bq),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=_params(st),
        interpret=st.interpret,
        name="kernlib_attention_bwd_dq",
    )(q, k, v, do, lse, delta, *segs)

    kv_seg_specs = []
    if st.has_seg:
        kv_seg_specs = [
            pl.BlockSpec((None, t), lambda i, bb, h: (bb, 0)),
            pl.BlockSpec((None, bk), lambda i, bb, h: (bb, i)),
        ]
    per_head = jax.ShapeDtypeStruct((b, t, hq, d), jnp.float32)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, bq=bq, bk=bk, nq=t // bq),
        grid=(t // bk, b, hq),
        in_specs=[full_q, kv_row, kv_row, full_q, full_vec, full_vec, *kv_seg_specs],
        out_specs=[row(bk), row(bk)],
        out_shape=[per_head, per_head],
        compiler_params=_params(st),
        interpret=st.interpret,
        name="kernlib_attention_bwd_dkv",
    )(q, k, v, do, lse, delta, *segs)
    hkv = k.shape[2]
    dk = _common.sum_kv_groups(dk, hkv).astype(k.dtype)
    dv = _common.sum_kv_groups(dv, hkv).astype(v.dtype)
    return dq, dk, dv


_flash = _common.make_flash(_forward, _backward)


def check(q, k, v, segment_ids=None, **options) -> str | None:
    if q.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        return f"dtype {q.dtype} is not float32/bfloat16/float16"
    if q.shape[3] > 256:
        return f"head_dim {q.shape[3]} > 256 does not fit the Triton tiles"
    return None


def run(q, k, v, segment_ids=None, *, config: Config, interpret: bool = False, **options):
    """The arguments are `base`'s; D is padded to a power of two >= 16 for Triton's tiles."""
    t, d = q.shape[1], q.shape[3]
    d_pad = max(16, next_power_of_two(d))
    padded, st = _common.prepare(
        q, k, v, segment_ids, config, interpret, minimum=16, head_dim_to=d_pad, **options
    )
    return _flash(*padded, st)[:, :t, :, :d]
