"""Grouped matmul in Pallas Mosaic (TPU), megablox-style with scalar-prefetched visits.

Forward grid (column tile, visit, K tile): visit metadata (group, row tile, row range) is
prefetched to SMEM and drives the BlockSpec index maps, so each step DMAs exactly the row tile
and the group's weight tile it needs. Visits of one row tile are consecutive, so the output
tile stays in VMEM across them: the first visit starts from zeros, later ones merge their
group's rows into it. The weight gradient uses the same visits (grid K tile, N tile, visit),
accumulating lhs_tile^T @ dout_tile per group in VMEM and writing when the group ends.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxstack.kernlib._src.config import KernelConfig, multiple_of
from jaxstack.kernlib.ops.grouped_matmul import _common, base


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_m: int = multiple_of(128, 128)
    block_k: int = multiple_of(128, 128)
    block_n: int = multiple_of(128, 128)
    SWEEP = ((256, 256, 256), (512, 256, 512), (256, 512, 256))


_Static = _common.Static


def _gmm_kernel(vg, vt, lo, hi, lhs_ref, rhs_ref, out_ref, acc_ref, *, bm, nk, nv):
    v, kb = pl.program_id(1), pl.program_id(2)

    @pl.when(kb == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] += jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kb == nk - 1)
    def _store():
        rows = vt[v] * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
        mask = jnp.logical_and(rows >= lo[v], rows < hi[v])
        first = jnp.logical_or(v == 0, vt[v] != vt[jnp.maximum(v - 1, 0)])
        prev = jnp.where(first, jnp.zeros(out_ref.shape, out_ref.dtype), out_ref[...])
        out_ref[...] = jnp.where(mask, acc_ref[...].astype(out_ref.dtype), prev)

    del nv


def _gmm(lhs_p, rhs_p, group_sizes, st: _Static):
    bm, bk, bn = st.config.block_m, st.config.block_k, st.config.block_n
    mp, kp = lhs_p.shape
    np_ = rhs_p.shape[2]
    meta = base.visits(group_sizes, mp, bm)
    nv, nk = meta[0].shape[0], kp // bk
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(np_ // bn, nv, nk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda j, v, kb, vg, vt, lo, hi: (vt[v], kb)),
            pl.BlockSpec((None, bk, bn), lambda j, v, kb, vg, vt, lo, hi: (vg[v], kb, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda j, v, kb, vg, vt, lo, hi: (vt[v], j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
    out = pl.pallas_call(
        functools.partial(_gmm_kernel, bm=bm, nk=nk, nv=nv),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((mp, np_), st.out_dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")
        ),
        interpret=st.interpret,
        name="kernlib_gmm",
    )(*meta, lhs_p, rhs_p)
    return out


def _tgmm_kernel(vg, vt, lo, hi, lhs_ref, dout_ref, out_ref, acc_ref, *, bm, nv):
    v = pl.program_id(2)
    first = jnp.logical_or(v == 0, vg[v] != vg[jnp.maximum(v - 1, 0)])
    last = jnp.logical_or(v == nv - 1, vg[v] != vg[jnp.minimum(v + 1, nv - 1)])

    @pl.when(first)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    rows = vt[v] * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
    mask = jnp.logical_and(rows >= lo[v], rows < hi[v])
    a = lhs_ref[...]
    a = jnp.where(mask, a, jnp.zeros((), a.dtype))
    acc_ref[...] += jax.lax.dot(a.T, dout_ref[...], preferred_element_type=jnp.float32)

    @pl.when(last)
    def _store():
        out_ref[...] = acc_ref[...]


def _tgmm(lhs_p, dout_p, group_sizes, st: _Static):
    bm, bk, bn = st.config.block_m, st.config.block_k, st.config.block_n
    g = group_sizes.shape[0]
    (mp, kp), np_ = lhs_p.shape, dout_p.shape[1]
    meta = base.visits(group_sizes, mp, bm)
    nv = meta[0].shape[0]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(kp // bk, np_ // bn, nv),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda a, b, v, vg, vt, lo, hi: (vt[v], a)),
            pl.BlockSpec((bm, bn), lambda a, b, v, vg, vt, lo, hi: (vt[v], b)),
        ],
        out_specs=pl.BlockSpec((None, bk, bn), lambda a, b, v, vg, vt, lo, hi: (vg[v], a, b)),
        scratch_shapes=[pltpu.VMEM((bk, bn), jnp.float32)],
    )
    out = pl.pallas_call(
        functools.partial(_tgmm_kernel, bm=bm, nv=nv),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((g, kp, np_), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=st.interpret,
        name="kernlib_tgmm",
    )(*meta, lhs_p, dout_p)
    # a group without rows has no visit: its block was never written
    return jnp.where((group_sizes > 0)[:, None, None], out, 0.0)


_differentiable = _common.make_differentiable(_gmm, _tgmm)


def check(lhs, rhs, group_sizes, **options) -> str | None:
    if reason := base.mixed_dtypes(lhs, rhs):
        return reason
    if lhs.dtype not in (jnp.float32, jnp.bfloat16):
        return f"dtype {lhs.dtype} is not float32/bfloat16"
    return None


def run(lhs, rhs, group_sizes, *, config: Config, interpret=False, preferred_element_type=None):
    out_dtype = jnp.dtype(base.out_dtype(lhs, rhs, preferred_element_type)).name
    st = _Static(config, out_dtype, bool(interpret))
    return _differentiable(lhs, rhs, group_sizes.astype(jnp.int32), st)
