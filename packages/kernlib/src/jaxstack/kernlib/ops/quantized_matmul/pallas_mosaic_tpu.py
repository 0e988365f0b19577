"""Quantized matmul in Pallas Mosaic (TPU): int8 weight tiles DMA'd to VMEM, converted there.

Grid (row tile, column tile, K block) with K sequential and an f32 VMEM accumulator. A K block
never straddles a scale tile, so each block's product is scaled by one scale row; scales (and
zero points) are laid out [tiles, 1, N] so their (1, block_n) blocks are legal TPU tiles. int4
codes are widened to int8 by XLA before the call (TPU int4 VMEM layouts are not used yet), so
int4 saves memory at rest but not HBM bandwidth on this path.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxstack.kernlib._src.config import KernelConfig, multiple_of, round_up
from jaxstack.kernlib.ops.quantized_matmul import _common


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_m: int = multiple_of(128, 8)
    block_n: int = multiple_of(256, 128)
    block_k: int = multiple_of(512, 128)
    SWEEP = ((128, 512, 512), (256, 256, 1024), (512, 512, 512))


_Static = _common.Static


def _kernel(*refs, st: _Static, nk: int):
    x_ref, v_ref, s_ref, *rest = refs
    zp_ref = rest[0] if st.has_zp else None
    o_ref, acc_ref = rest[-2], rest[-1]
    kb = pl.program_id(2)

    @pl.when(kb == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    w = v_ref[...].astype(jnp.float32)
    if zp_ref is not None:
        w = w - zp_ref[...].astype(jnp.float32)
    x = x_ref[...]
    part = jnp.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
    acc_ref[...] += part * s_ref[...].astype(jnp.float32)

    @pl.when(kb == nk - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _forward(x2, v, scales, zp, st: _Static):
    bm, bn, bk = st.config.block_m, st.config.block_n, st.config.block_k
    mp, kp = x2.shape
    np_ = v.shape[1]
    per_tile = st.tile_k // bk
    to3 = lambda a: _common.pad2d(a, (1, bn))[:, None, :]
    stat = pl.BlockSpec((None, 1, bn), lambda i, j, kb: (kb // per_tile, 0, j))
    args = [x2, v, to3(scales)] + ([to3(zp)] if zp is not None else [])
    specs = [
        pl.BlockSpec((bm, bk), lambda i, j, kb: (i, kb)),
        pl.BlockSpec((bk, bn), lambda i, j, kb: (kb, j)),
        stat,
    ] + ([stat] if zp is not None else [])
    nk = kp // bk
    return pl.pallas_call(
        functools.partial(_kernel, st=st, nk=nk),
        grid=(mp // bm, np_ // bn, nk),
        in_specs=specs,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kb: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), st.out_dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=st.interpret,
        name="kernlib_quantized_matmul",
    )(*args)


def _block_k(config: Config, tile: int) -> int | None:
    bk = min(config.block_k, tile)
    while bk >= 128 and (tile % bk or bk % 128):
        bk -= 128
    return bk if bk >= 128 else None


def check(x, values, scales, zero_points=None, **options) -> str | None:
    tile = _common.scale_tile(values, scales)
    if _block_k(Config(), tile) is None:
        return f"scale tile {tile} along K is not a multiple of 128"
    if x.dtype not in (jnp.bfloat16, jnp.float32):
        return f"activation dtype {x.dtype} is not bfloat16/float32"
    return None


def _fit(config: Config, rows: int, tile: int, int4: bool) -> Config:
    """Row blocks no taller than the rows need (whole sublanes), K blocks within a scale tile."""
    del int4  # widened to int8 before the call
    return dataclasses.replace(
        config, block_m=min(config.block_m, round_up(rows, 8)), block_k=_block_k(config, tile)
    )


run = _common.make_run(_forward, _fit)
