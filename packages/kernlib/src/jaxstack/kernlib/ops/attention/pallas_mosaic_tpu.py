"""Flash attention for TPUs in Pallas Mosaic: forward, and a two-kernel backward (dq; dk+dv).

Layout inside the kernels is [B, H, T, D] (TPU tiles want the sequence and head_dim as the last
two block dimensions). Grid (batch, head, query block, key block) with the key axis sequential
("arbitrary"): running max / sum / accumulator live in VMEM scratch across it, and blocks the
causal / sliding-window mask cannot reach are skipped. Row statistics (log-sum-exp, delta) and
query segment ids are kept 128 lanes wide and key segment ids 8 sublanes tall, the shapes
Mosaic lays out natively (as jax's own TPU flash attention does).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxstack.kernlib._src.config import KernelConfig, multiple_of
from jaxstack.kernlib.ops.attention import _common, base

LANES = 128
SUBLANES = 8
NT = (((1,), (1,)), ((), ()))  # a @ b.T


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    """Tile sizes of the Mosaic kernels (multiples of 128)."""

    block_q: int = multiple_of(128, LANES)
    block_k: int = multiple_of(128, LANES)
    block_q_bwd: int = multiple_of(128, LANES)
    block_k_bwd: int = multiple_of(128, LANES)
    SWEEP = (
        (256, 256, 256, 256),
        (256, 512, 256, 256),
        (512, 512, 512, 512),
        (512, 1024, 512, 512),
    )


_Static = _common.Static


def _scores(q, k, iq, ik, bq, bk, qs_ref, ks_ref, st: _Static):
    """Soft-capped logits, tanh (for the cap's derivative), and the visibility mask."""
    s = jax.lax.dot_general(q, k, NT, preferred_element_type=jnp.float32) * st.scale
    t = None
    if st.cap is not None:
        t = jnp.tanh(s / st.cap)
        s = st.cap * t
    shape = (bq, bk)
    q_pos = iq * bq + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    k_pos = ik * bk + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    q_seg = k_seg = None
    if st.has_seg:
        q_seg = jnp.tile(qs_ref[...], (1, bk // LANES))
        k_seg = ks_ref[:1, :]
    mask = base.visible(q_pos, k_pos, q_seg, k_seg, causal=st.causal, sliding_window=st.window)
    return s, t, mask


def _split(refs, st: _Static, n_in: int):
    ins, rest = refs[:n_in], refs[n_in:]
    segs = (None, None)
    if st.has_seg:
        segs, rest = rest[:2], rest[2:]
    return ins, segs, rest


def _fwd_kernel(*refs, st: _Static, bq: int, bk: int, nk: int):
    (q_ref, k_ref, v_ref), (qs_ref, ks_ref), (o_ref, lse_ref, m_scr, l_scr, acc_scr) = _split(
        refs, st, 3
    )
    iq, ik = pl.program_id(2), pl.program_id(3)

    @pl.when(ik == 0)
    def _init():
        m_scr[...] = jnp.full(m_scr.shape, base.MASK_VALUE, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    lo, hi = _common.kv_block_range(iq, bq, bk, nk, st.causal, st.window)

    @pl.when(jnp.logical_and(ik >= lo, ik < hi))
    def _step():
        s, _, mask = _scores(q_ref[...], k_ref[...], iq, ik, bq, bk, qs_ref, ks_ref, st)
        if mask is not None:
            s = jnp.where(mask, s, base.MASK_VALUE)
        m_prev = m_scr[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new[:, :1])
        if mask is not None:
            p = jnp.where(mask, p, 0.0)
        l_scr[...] = alpha * l_scr[...] + jnp.sum(p, axis=1, keepdims=True)
        m_scr[...] = m_new
        v = v_ref[...]
        pv = jax.lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        acc_scr[...] = alpha[:, :1] * acc_scr[...] + pv

    @pl.when(ik == nk - 1)
    def _finish():
        row_sum = l_scr[...]
        empty = row_sum == 0.0
        l_safe = jnp.where(empty, 1.0, row_sum)
        o_ref[...] = (acc_scr[...] / l_safe[:, :1]).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, 0.0, m_scr[...] + jnp.log(l_safe))


def _seg_specs(st: _Static, bq: int, bk: int, q_major: bool = True) -> list:
    """Block specs of the query / key segment ids (none without segments); grid (b, h, query
    block, key block), or (b, h, key block, query block) when not `q_major`."""
    if not st.has_seg:
        return []
    if q_major:
        q_map, k_map = (lambda bb, h, i, j: (bb, i, 0)), (lambda bb, h, i, j: (bb, 0, j))
    else:
        q_map, k_map = (lambda bb, h, j, i: (bb, i, 0)), (lambda bb, h, j, i: (bb, 0, j))
    return [pl.BlockSpec((None, bq, LANES), q_map), pl.BlockSpec((None, SUBLANES, bk), k_map)]


def _seg_arrays(seg):
    b, t = seg.shape
    q_seg = jnp.broadcast_to(seg[:, :, None], (b, t, LANES))
    k_seg = jnp.broadcast_to(seg[:, None, :], (b, SUBLANES, t))
    return q_seg, k_seg


def _cost(st: _Static, q, matmuls: int, arrays) -> pl.CostEstimate:
    """What the TPU cost model cannot see inside the kernel: `matmuls` [T, T] x [T, D] products
    per head over the visible part of the score matrix, one exp per visible score, and one
    pass over `arrays` (the kernel's inputs and outputs)."""
    b, hq, t, d = q.shape
    visible = 0.5 if st.causal else 1.0
    if st.window is not None:
        visible = min(visible, st.window / t)
    scores = b * hq * t * t * visible
    moved = sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in arrays)
    return pl.CostEstimate(
        flops=int(2 * matmuls * scores * d), transcendentals=int(scores), bytes_accessed=moved
    )


def _forward(q, k, v, seg, st: _Static):
    """q [B,Hq,T,D], k/v [B,Hkv,T,D] -> out [B,Hq,T,D], lse [B,Hq,T,128]."""
    b, hq, t, d = q.shape
    bq, bk, g = st.config.block_q, st.config.block_k, st.group
    nq, nk = t // bq, t // bk
    in_specs = [
        pl.BlockSpec((None, None, bq, d), lambda bb, h, i, j: (bb, h, i, 0)),
        pl.BlockSpec((None, None, bk, d), lambda bb, h, i, j: (bb, h // g, j, 0)),
        pl.BlockSpec((None, None, bk, d), lambda bb, h, i, j: (bb, h // g, j, 0)),
    ]
    segs = list(_seg_arrays(seg)) if st.has_seg else []
    return pl.pallas_call(
        functools.partial(_fwd_kernel, st=st, bq=bq, bk=bk, nk=nk),
        grid=(b, hq, nq, nk),
        in_specs=[*in_specs, *_seg_specs(st, bq, bk)],
        out_specs=[
            pl.BlockSpec((None, None, bq, d), lambda bb, h, i, j: (bb, h, i, 0)),
            pl.BlockSpec((None, None, bq, LANES), lambda bb, h, i, j: (bb, h, i, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, hq, t, LANES), jnp.float32),
        ],
        scratch_shapes=[
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, d), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=st.interpret,
        cost_estimate=_cost(st, q, 2, [q, k, v, q]),
        name="kernlib_attention_fwd",
    )(q, k, v, *segs)


def _probs_and_dscores(ins, iq, ik, bq, bk, qs_ref, ks_ref, st: _Static):
    """Loads a backward step's blocks (q, k, v, do, lse, delta); returns q, k and do with the
    probabilities and the logits' gradient."""
    q, k, v, do, lse, delta = (ref[...] for ref in ins)
    s, t, mask = _scores(q, k, iq, ik, bq, bk, qs_ref, ks_ref, st)
    p = jnp.exp(s - lse[:, :1])
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    dp = jax.lax.dot_general(do, v, NT, preferred_element_type=jnp.float32)
    ds = p * (dp - delta[:, :1])
    if t is not None:
        ds = ds * (1.0 - t * t)
    return q, k, do, p, ds


def _dq_kernel(*refs, st: _Static, bq: int, bk: int, nk: int):
    ins, (qs_ref, ks_ref), (dq_ref, dq_scr) = _split(refs, st, 6)
    iq, ik = pl.program_id(2), pl.program_id(3)

    @pl.when(ik == 0)
    def _init():
        dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

    lo, hi = _common.kv_block_range(iq, bq, bk, nk, st.causal, st.window)

    @pl.when(jnp.logical_and(ik >= lo, ik < hi))
    def _step():
        _, k, _, _, ds = _probs_and_dscores(ins, iq, ik, bq, bk, qs_ref, ks_ref, st)
        dq_scr[...] += jax.lax.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    @pl.when(ik == nk - 1)
    def _finish():
        dq_ref[...] = (dq_scr[...] * st.scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, st: _Static, bq: int, bk: int, nq: int):
    ins, (qs_ref, ks_ref), (dk_ref, dv_ref, dk_scr, dv_scr) = _split(refs, st, 6)
    ik, iq = pl.program_id(2), pl.program_id(3)

    @pl.when(iq == 0)
    def _init():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    lo, hi = _common.q_block_range(ik, bq, bk, nq, st.causal, st.window)

    @pl.when(jnp.logical_and(iq >= lo, iq < hi))
    def _step():
        q, _, do, p, ds = _probs_and_dscores(ins, iq, ik, bq, bk, qs_ref, ks_ref, st)
        dv_scr[...] += jax.lax.dot(p.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
        dk_scr[...] += jax.lax.dot(ds.T.astype(q.dtype), q, preferred_element_type=jnp.float32)

    @pl.when(iq == nq - 1)
    def _finish():
        dk_ref[...] = dk_scr[...] * st.scale
        dv_ref[...] = dv_scr[...]


def _backward(q, k, v, seg, out, lse, do, st: _Static):
    b, hq, t, d = q.shape
    g = st.group
    bq, bk = st.config.block_q_bwd, st.config.block_k_bwd
    nq, nk = t // bq, t // bk
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    delta = jnp.broadcast_to(delta, (b, hq, t, LANES))
    segs = list(_seg_arrays(seg)) if st.has_seg else []
    params = pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
    )

    # dq: grid (b, h, query block, key block)
    qrow = pl.BlockSpec((None, None, bq, d), lambda bb, h, i, j: (bb, h, i, 0))
    krow = pl.BlockSpec((None, None, bk, d), lambda bb, h, i, j: (bb, h // g, j, 0))
    stat = pl.BlockSpec((None, None, bq, LANES), lambda bb, h, i, j: (bb, h, i, 0))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, st=st, bq=bq, bk=bk, nk=nk),
        grid=(b, hq, nq, nk),
        in_specs=[qrow, krow, krow, qrow, stat, stat, *_seg_specs(st, bq, bk)],
        out_specs=qrow,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, d), jnp.float32)],
        compiler_params=params,
        interpret=st.interpret,
        cost_estimate=_cost(st, q, 3, [q, k, v, q, q]),
        name="kernlib_attention_bwd_dq",
    )(q, k, v, do, lse, delta, *segs)

    # dk, dv: grid (b, h, key block, query block), one f32 copy per query head
    qrow_t = pl.BlockSpec((None, None, bq, d), lambda bb, h, j, i: (bb, h, i, 0))
    krow_t = pl.BlockSpec((None, None, bk, d), lambda bb, h, j, i: (bb, h // g, j, 0))
    stat_t = pl.BlockSpec((None, None, bq, LANES), lambda bb, h, j, i: (bb, h, i, 0))
    out_row = pl.BlockSpec((None, None, bk, d), lambda bb, h, j, i: (bb, h, j, 0))
    per_head = jax.ShapeDtypeStruct((b, hq, t, d), jnp.float32)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, bq=bq, bk=bk, nq=nq),
        grid=(b, hq, nk, nq),
        in_specs=[qrow_t, krow_t, krow_t, qrow_t, stat_t, stat_t, *_seg_specs(st, bq, bk, False)],
        out_specs=[out_row, out_row],
        out_shape=[per_head, per_head],
        scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32), pltpu.VMEM((bk, d), jnp.float32)],
        compiler_params=params,
        interpret=st.interpret,
        cost_estimate=_cost(st, q, 4, [q, k, v, q, per_head, per_head]),
        name="kernlib_attention_bwd_dkv",
    )(q, k, v, do, lse, delta, *segs)
    hkv = k.shape[1]
    dk = dk.reshape(b, hkv, g, t, d).sum(axis=2).astype(k.dtype)
    dv = dv.reshape(b, hkv, g, t, d).sum(axis=2).astype(v.dtype)
    return dq, dk, dv


_flash = _common.make_flash(_forward, _backward)


def check(q, k, v, segment_ids=None, **options) -> str | None:
    if q.dtype not in (jnp.float32, jnp.bfloat16):
        return f"dtype {q.dtype} is not float32/bfloat16"
    return None


def run(q, k, v, segment_ids=None, *, config: Config, interpret: bool = False, **options):
    """The arguments are `base`'s; the kernels see [B, H, T, D]."""
    (qp, kp, vp, seg), st = _common.prepare(
        q, k, v, segment_ids, config, interpret, minimum=LANES, **options
    )
    to_bhtd = lambda x: jnp.swapaxes(x, 1, 2)
    out = _flash(to_bhtd(qp), to_bhtd(kp), to_bhtd(vp), seg, st)
    return to_bhtd(out)[:, : q.shape[1]]
