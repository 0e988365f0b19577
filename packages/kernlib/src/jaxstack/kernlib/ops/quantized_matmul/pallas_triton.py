"""Quantized matmul in Pallas Triton: integer weight tiles are converted in registers.

Grid (row tile, column tile); each program walks K in blocks that never straddle a scale tile,
so one scale row (and zero-point row) applies to the whole partial product:
`acc += (x_blk @ (v_blk - z)) * s`. int8 codes minus zero points are exact in bf16/f16.
int4 codes are repacked two per byte along K (even rows in the low nibble, odd rows in the
high nibble) and x is split into its even and odd columns, so the kernel reads half the bytes
and unpacks with two shifts; the repacking is one XLA pass per call.
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
from jaxstack.kernlib.ops.quantized_matmul import _common


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_m: int = power_of_two(16, 16)
    block_n: int = power_of_two(64, 16)
    block_k: int = power_of_two(64, 16)
    num_warps: int = 4
    num_stages: int = 3
    SWEEP = ((16, 128, 64), (32, 64, 128), (64, 128, 64, 8), (128, 128, 32))


_Static = _common.Static


def _kernel(*refs, st: _Static, nk: int):
    if st.int4:
        xe_ref, xo_ref, v_ref, s_ref, *rest = refs
    else:
        x_ref, v_ref, s_ref, *rest = refs
    zp_ref = rest[0] if st.has_zp else None
    o_ref = rest[-1]
    bk = st.config.block_k
    rows_per_block = bk // 2 if st.int4 else bk
    blocks_per_tile = st.tile_k // bk

    def body(kb, acc):
        scale_row = kb // blocks_per_tile
        s = s_ref[scale_row, :].astype(jnp.float32)
        z = None if zp_ref is None else zp_ref[scale_row, :].astype(jnp.float32)
        v = v_ref[pl.ds(kb * rows_per_block, rows_per_block), :]

        def deq(codes):
            w = codes.astype(jnp.float32)
            if z is not None:
                w = w - z[None, :]
            return w

        if st.int4:
            low = lax.shift_right_arithmetic(lax.shift_left(v, jnp.int8(4)), jnp.int8(4))
            high = lax.shift_right_arithmetic(v, jnp.int8(4))
            xs = pl.ds(kb * rows_per_block, rows_per_block)
            xe, xo = xe_ref[:, xs], xo_ref[:, xs]
            part = plgpu.dot(xe, deq(low).astype(xe.dtype))
            part += plgpu.dot(xo, deq(high).astype(xo.dtype))
        else:
            xb = x_ref[:, pl.ds(kb * bk, bk)]
            part = plgpu.dot(xb, deq(v).astype(xb.dtype))
        return acc + part * s[None, :]

    acc = lax.fori_loop(0, nk, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _forward(x2, v, scales, zp, st: _Static):
    cfg = st.config
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    mp, kp = x2.shape
    n_tiles = kp // st.tile_k
    scales = _common.pad2d(scales, (1, bn), rows=n_tiles)
    zp = None if zp is None else _common.pad2d(zp, (1, bn), rows=n_tiles)
    np_ = v.shape[1]
    if st.int4:
        v = jnp.bitwise_or(
            jnp.bitwise_and(v[0::2], jnp.int8(0xF)), lax.shift_left(v[1::2], jnp.int8(4))
        )
        x_args = [x2[:, 0::2], x2[:, 1::2]]
        x_specs = [pl.BlockSpec((bm, kp // 2), lambda i, j: (i, 0))] * 2
    else:
        x_args = [x2]
        x_specs = [pl.BlockSpec((bm, kp), lambda i, j: (i, 0))]
    col = lambda rows: pl.BlockSpec((rows, bn), lambda i, j: (0, j))
    args = [*x_args, v, scales] + ([zp] if zp is not None else [])
    specs = [*x_specs, col(v.shape[0]), col(n_tiles)] + ([col(n_tiles)] if zp is not None else [])
    return pl.pallas_call(
        functools.partial(_kernel, st=st, nk=kp // bk),
        grid=(mp // bm, np_ // bn),
        in_specs=specs,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), st.out_dtype),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=st.interpret,
        name="kernlib_quantized_matmul",
    )(*args)


def _block_k(config: Config, tile: int, int4: bool) -> int | None:
    """Largest power-of-two K block <= config's dividing the scale tile (int4 halves it, and
    Triton dots need >= 16 along K)."""
    minimum = 32 if int4 else 16
    bk = min(max(config.block_k, minimum), tile)
    while bk >= minimum and tile % bk:
        bk //= 2
    return bk if bk >= minimum else None


def check(x, values, scales, zero_points=None, **options) -> str | None:
    tile = _common.scale_tile(values, scales)
    if _block_k(Config(), tile, _common.is_int4(values)) is None:
        return f"scale tile {tile} along K has no power-of-two block >= 16 dividing it"
    if x.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
        return f"activation dtype {x.dtype} is not bfloat16/float16/float32"
    return None


def _fit(config: Config, rows: int, tile: int, int4: bool) -> Config:
    """Row blocks no taller than the rows need (a power of two >= 16), K blocks within a scale
    tile."""
    return dataclasses.replace(
        config, block_m=clamp_block(config.block_m, rows, 16), block_k=_block_k(config, tile, int4)
    )


run = _common.make_run(_forward, _fit)
