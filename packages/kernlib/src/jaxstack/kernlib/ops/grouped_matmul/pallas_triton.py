"""Grouped matmul in Pallas Triton.

Forward: grid (visit, column tile). A visit is one (group, row tile) pair; it multiplies the row
tile by that group's weights over the whole K axis in f32 and stores only the group's rows
(masked store), so the groups sharing a boundary tile never overwrite each other. Backward for
the weights: grid (group, K tile, N tile), each program walking its group's row tiles.
Operands are zero-padded to the block sizes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxstack.kernlib._src.config import KernelConfig, clamp_block, power_of_two
from jaxstack.kernlib.ops.grouped_matmul import _common, base


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_m: int = power_of_two(64, 16)
    block_k: int = power_of_two(32, 16)
    block_n: int = power_of_two(64, 16)
    num_warps: int = 4
    num_stages: int = 3
    SWEEP = ((128, 32, 128, 4, 3), (128, 64, 128, 8, 3), (64, 64, 128, 4, 4), (128, 32, 64, 4, 4))


_Static = _common.Static


def _params(st):
    return plgpu.CompilerParams(num_warps=st.config.num_warps, num_stages=st.config.num_stages)


def _gmm_kernel(vg_ref, vt_ref, lo_ref, hi_ref, lhs_ref, rhs_ref, out_ref, *, bm, bk, nk):
    v = pl.program_id(0)
    g, tile = vg_ref[v], vt_ref[v]
    lo, hi = lo_ref[v], hi_ref[v]
    row0 = tile * bm

    def body(kb, acc):
        a = lhs_ref[pl.ds(row0, bm), pl.ds(kb * bk, bk)]
        b = rhs_ref[g, pl.ds(kb * bk, bk), :]
        return acc + plgpu.dot(a, b)

    acc = lax.fori_loop(0, nk, body, jnp.zeros((bm, out_ref.shape[1]), jnp.float32))
    rows = row0 + jnp.arange(bm, dtype=jnp.int32)
    mask = jnp.logical_and(rows >= lo, rows < hi)[:, None]
    plgpu.store(out_ref.at[pl.ds(row0, bm), :], acc.astype(out_ref.dtype), mask=mask)


def _gmm(lhs_p, rhs_p, group_sizes, st: _Static):
    bm, bk, bn = st.config.block_m, st.config.block_k, st.config.block_n
    (mp, kp), np_ = lhs_p.shape, rhs_p.shape[2]
    meta = base.visits(group_sizes, mp, bm)
    whole = lambda shape: pl.BlockSpec(shape, lambda v, j: (0,) * len(shape))
    return pl.pallas_call(
        functools.partial(_gmm_kernel, bm=bm, bk=bk, nk=kp // bk),
        grid=(meta[0].shape[0], np_ // bn),
        in_specs=[
            *(whole(x.shape) for x in meta),
            whole((mp, kp)),
            pl.BlockSpec((rhs_p.shape[0], kp, bn), lambda v, j: (0, 0, j)),
        ],
        out_specs=pl.BlockSpec((mp, bn), lambda v, j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), st.out_dtype),
        compiler_params=_params(st),
        interpret=st.interpret,
        name="kernlib_gmm",
    )(*meta, lhs_p, rhs_p)


def _tgmm_kernel(start_ref, end_ref, lhs_ref, dout_ref, out_ref, *, bm):
    g = pl.program_id(0)
    start, end = start_ref[g], end_ref[g]

    def body(tile, acc):
        rows = tile * bm + jnp.arange(bm, dtype=jnp.int32)
        mask = jnp.logical_and(rows >= start, rows < end)[:, None]
        a = lhs_ref[pl.ds(tile * bm, bm), :]
        a = jnp.where(mask, a, jnp.zeros((), a.dtype))
        d = dout_ref[pl.ds(tile * bm, bm), :]
        return acc + plgpu.dot(a, d, trans_a=True)

    hi = lax.div(end + bm - 1, bm)
    acc = lax.fori_loop(lax.div(start, bm), hi, body, jnp.zeros(out_ref.shape, jnp.float32))
    out_ref[...] = acc


def _tgmm(lhs_p, dout_p, group_sizes, st: _Static):
    bm, bk, bn = st.config.block_m, st.config.block_k, st.config.block_n
    g = group_sizes.shape[0]
    (mp, kp), np_ = lhs_p.shape, dout_p.shape[1]
    starts, ends = base.group_bounds(group_sizes, mp)
    vec = pl.BlockSpec((g,), lambda i, a, b: (0,))
    return pl.pallas_call(
        functools.partial(_tgmm_kernel, bm=bm),
        grid=(g, kp // bk, np_ // bn),
        in_specs=[
            vec,
            vec,
            pl.BlockSpec((mp, bk), lambda i, a, b: (0, a)),
            pl.BlockSpec((mp, bn), lambda i, a, b: (0, b)),
        ],
        out_specs=pl.BlockSpec((None, bk, bn), lambda i, a, b: (i, a, b)),
        out_shape=jax.ShapeDtypeStruct((g, kp, np_), jnp.float32),
        compiler_params=_params(st),
        interpret=st.interpret,
        name="kernlib_tgmm",
    )(starts, ends, lhs_p, dout_p)


_differentiable = _common.make_differentiable(_gmm, _tgmm)


def check(lhs, rhs, group_sizes, **options) -> str | None:
    if reason := base.mixed_dtypes(lhs, rhs):
        return reason
    if not jnp.issubdtype(lhs.dtype, jnp.floating):
        return f"dtype {lhs.dtype} is not floating point"
    return None


def run(lhs, rhs, group_sizes, *, config: Config, interpret=False, preferred_element_type=None):
    m, k = lhs.shape
    n = rhs.shape[2]
    cfg = dataclasses.replace(
        config,
        block_m=clamp_block(config.block_m, m, 16),
        block_k=clamp_block(config.block_k, k, 16),
        block_n=clamp_block(config.block_n, n, 16),
    )
    out_dtype = jnp.dtype(base.out_dtype(lhs, rhs, preferred_element_type)).name
    st = _Static(cfg, out_dtype, bool(interpret))
    return _differentiable(lhs, rhs, group_sizes.astype(jnp.int32), st)
