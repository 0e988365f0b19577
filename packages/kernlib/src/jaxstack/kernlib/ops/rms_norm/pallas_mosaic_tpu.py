"""RMS norm in Pallas Mosaic (TPU): row blocks in VMEM, f32 statistics, fused backward.

The feature axis is one full block (any width; Mosaic pads lanes internally); row blocks are a
multiple of 8 sublanes. dweight partials are written per row block and summed by XLA.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxstack.kernlib._src.config import KernelConfig, multiple_of, round_up
from jaxstack.kernlib.ops.rms_norm import _common


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_rows: int = multiple_of(256, 8)
    SWEEP = ((64,), (128,), (512,), (1024,))


_Static = _common.Static


def _rstd(x, st):
    return jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + st.eps)


def _fwd_kernel(x_ref, w_ref, y_ref, *, st: _Static):
    x = x_ref[...].astype(jnp.float32)
    w = st.offset + w_ref[...].astype(jnp.float32)
    y_ref[...] = (x * _rstd(x, st) * w).astype(y_ref.dtype)


def _bwd_kernel(x_ref, w_ref, dy_ref, dx_ref, dw_ref, *, st: _Static):
    x = x_ref[...].astype(jnp.float32)
    dy = dy_ref[...].astype(jnp.float32)
    w = st.offset + w_ref[...].astype(jnp.float32)
    rstd = _rstd(x, st)
    xhat = x * rstd
    wdy = dy * w
    c = jnp.mean(wdy * xhat, axis=1, keepdims=True)
    dx_ref[...] = ((wdy - xhat * c) * rstd).astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(dy * xhat, axis=0, keepdims=True)


def _specs(st: _Static, d: int):
    br = st.config.block_rows
    return pl.BlockSpec((br, d), lambda i: (i, 0)), pl.BlockSpec((1, d), lambda i: (0, 0))


def _params():
    return pltpu.CompilerParams(dimension_semantics=("parallel",))


def _forward(x2, w, st: _Static):
    rows, d = x2.shape
    row, vec = _specs(st, d)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, st=st),
        grid=(rows // st.config.block_rows,),
        in_specs=[row, vec],
        out_specs=row,
        out_shape=jax.ShapeDtypeStruct(x2.shape, x2.dtype),
        compiler_params=_params(),
        interpret=st.interpret,
        name="kernlib_rms_norm",
    )(x2, w.reshape(1, d))


def _backward(x2, w, dy, st: _Static):
    rows, d = x2.shape
    row, vec = _specs(st, d)
    nblocks = rows // st.config.block_rows
    dx, dw = pl.pallas_call(
        functools.partial(_bwd_kernel, st=st),
        grid=(nblocks,),
        in_specs=[row, vec, row],
        out_specs=[row, pl.BlockSpec((None, 1, d), lambda i: (i, 0, 0))],
        out_shape=[
            jax.ShapeDtypeStruct(x2.shape, x2.dtype),
            jax.ShapeDtypeStruct((nblocks, 1, d), jnp.float32),
        ],
        compiler_params=_params(),
        interpret=st.interpret,
        name="kernlib_rms_norm_bwd",
    )(x2, w.reshape(1, d), dy)
    return dx, dw.reshape(nblocks, d)


_fused = _common.make_fused(_forward, _backward)


# The smallest default scoped-VMEM limit is v5e's 16 MiB; a block of rows stays under this.
VMEM_BUDGET = 12 * 1024 * 1024


def max_block_rows(d: int, itemsize: int) -> int:
    """The most rows whose backward fits VMEM_BUDGET (x, dy and dx blocks, double-buffered,
    plus about six float32 temporaries of the block), as a power of two, so that the usual
    power-of-two row counts need no padding; 0 when not even 8 rows fit."""
    rows = VMEM_BUDGET // (d * (2 * 3 * itemsize + 6 * 4))
    return 0 if rows < 8 else 1 << (rows.bit_length() - 1)


def check(x, weight=None, **options) -> str | None:
    if max_block_rows(x.shape[-1], x.dtype.itemsize) < 8:
        return f"feature dim {x.shape[-1]} too wide for an 8-row block in VMEM"
    return None


def run(x, weight=None, *, config: Config, interpret=False, eps=1e-6, weight_offset=0.0):
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    br = min(config.block_rows, max(8, round_up(rows, 8)), max_block_rows(d, x.dtype.itemsize))
    cfg = Config(block_rows=br)
    x2, w, rows = _common.as_rows(x, weight, br)
    st = _Static(d, float(eps), float(weight_offset), cfg, bool(interpret))
    y = _fused(x2, w, st)
    return y[:rows].reshape(x.shape)
