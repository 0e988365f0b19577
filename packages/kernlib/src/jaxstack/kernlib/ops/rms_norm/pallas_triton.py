"""RMS norm in Pallas Triton: one program per block of rows, statistics in f32 registers.

The backward recomputes 1/rms from x (one reduction, cheaper than storing it) and writes dx
plus one partial dweight row per block, which XLA sums. The feature axis is padded to a power of
two (Triton tiles), with the mean taken over the true width.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxstack.kernlib._src.config import KernelConfig, next_power_of_two, power_of_two
from jaxstack.kernlib.ops.rms_norm import _common


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_rows: int = power_of_two(4)
    num_warps: int = 4
    SWEEP = ((1, 4), (2, 4), (8, 8), (16, 8))


_Static = _common.Static


def _fwd_kernel(x_ref, w_ref, y_ref, *, st: _Static):
    x = x_ref[...].astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.sum(x * x, axis=1) / st.dim + st.eps)
    w = st.offset + w_ref[...].astype(jnp.float32)
    y_ref[...] = (x * rstd[:, None] * w[None, :]).astype(y_ref.dtype)


def _bwd_kernel(x_ref, w_ref, dy_ref, dx_ref, dw_ref, *, st: _Static):
    x = x_ref[...].astype(jnp.float32)
    dy = dy_ref[...].astype(jnp.float32)
    w = st.offset + w_ref[...].astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.sum(x * x, axis=1) / st.dim + st.eps)
    xhat = x * rstd[:, None]
    wdy = dy * w[None, :]
    c = jnp.sum(wdy * xhat, axis=1) / st.dim
    dx_ref[...] = ((wdy - xhat * c[:, None]) * rstd[:, None]).astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(dy * xhat, axis=0)


def _call(kernel, st: _Static, rows: int, dp: int, n_row_in: int, out_shape, out_specs):
    br = st.config.block_rows
    row = pl.BlockSpec((br, dp), lambda i: (i, 0))
    vec = pl.BlockSpec((dp,), lambda i: (0,))
    in_specs = [row, vec] + [row] * (n_row_in - 1)
    return pl.pallas_call(
        functools.partial(kernel, st=st),
        grid=(rows // br,),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=st.config.num_warps, num_stages=1),
        interpret=st.interpret,
        name="kernlib_rms_norm",
    )


def _forward(x2, w, st: _Static):
    rows, dp = x2.shape
    row = pl.BlockSpec((st.config.block_rows, dp), lambda i: (i, 0))
    return _call(_fwd_kernel, st, rows, dp, 1, jax.ShapeDtypeStruct(x2.shape, x2.dtype), row)(x2, w)


def _backward(x2, w, dy, st: _Static):
    rows, dp = x2.shape
    br = st.config.block_rows
    row = pl.BlockSpec((br, dp), lambda i: (i, 0))
    dw_spec = pl.BlockSpec((None, dp), lambda i: (i, 0))
    out_shape = [
        jax.ShapeDtypeStruct(x2.shape, x2.dtype),
        jax.ShapeDtypeStruct((rows // br, dp), jnp.float32),
    ]
    return _call(_bwd_kernel, st, rows, dp, 2, out_shape, [row, dw_spec])(x2, w, dy)


_fused = _common.make_fused(_forward, _backward)


def check(x, weight=None, **options) -> str | None:
    if x.shape[-1] > 65536:
        return f"feature dim {x.shape[-1]} > 65536 does not fit one Triton row block"
    return None


def run(x, weight=None, *, config: Config, interpret=False, eps=1e-6, weight_offset=0.0):
    d = x.shape[-1]
    dp = max(16, next_power_of_two(d))
    x2, w, rows = _common.as_rows(x, weight, config.block_rows, dp)
    st = _Static(d, float(eps), float(weight_offset), config, bool(interpret))
    y = _fused(x2, w, st)
    return y[:rows, :d].reshape(x.shape)
