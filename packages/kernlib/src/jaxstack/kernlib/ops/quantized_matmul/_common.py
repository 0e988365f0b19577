"""Shared by the Pallas quantized-matmul backends: the `run` around their kernels (row
flattening, scale layout, static options), operand padding and the x-only custom VJP."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxstack.kernlib.ops.quantized_matmul import base


@dataclasses.dataclass(frozen=True)
class Static:
    """Compile-time options of one call (hashable: the custom VJP's non-differentiable arg)."""

    config: Any  # the backend's own Config, fitted to the call
    tile_k: int  # rows of K per scale row
    int4: bool
    has_zp: bool
    out_dtype: str
    interpret: bool


def scale_tile(values, scales) -> int:
    """Rows of K per scale row (K for per-channel scales)."""
    return values.shape[0] // scales.reshape(-1, values.shape[1]).shape[0]


def is_int4(values) -> bool:
    return jnp.dtype(values.dtype) == jnp.dtype(jnp.int4)


def make_run(kernel, fit):
    """A backend's `run` from its kernel (as for `make_differentiable`) and `fit(config, rows,
    tile_k, int4) -> config`, the block sizes it uses for a call of that many rows of x."""
    differentiable = make_differentiable(kernel)

    def run(x, values, scales, zero_points=None, *, config, interpret=False, out_dtype=None):
        """x [..., K] times the weight (`values`, `scales`, `zero_points` as `base`): [..., N]."""
        n = values.shape[1]
        scales = scales.reshape(-1, n)
        tile, int4 = scale_tile(values, scales), is_int4(values)
        cfg = fit(config, max(1, x.size // x.shape[-1]), tile, int4)
        out_dtype = jnp.dtype(out_dtype or x.dtype).name
        st = Static(cfg, tile, int4, zero_points is not None, out_dtype, bool(interpret))
        zp = None if zero_points is None else zero_points.reshape(scales.shape)
        out = differentiable(flatten_rows(x), values, scales, zp, st)
        return out.reshape(*x.shape[:-1], n)

    return run


def make_differentiable(kernel):
    """f(x2, values, scales, zp, st) -> [M, N] from a backend's kernel(x2 [Mp, Kp], codes int8
    [Kp, Np], scales, zp, st) -> [Mp, Np], which sees x2 and the codes zero-padded to whole
    (block_m, block_k) and (block_k, block_n) tiles. The VJP reaches x only (weights are
    constants), computed by XLA against the dequantised weight."""

    def forward(x2, values, scales, zp, st):
        c = st.config
        x2_p = pad2d(x2, (c.block_m, c.block_k))
        codes = pad2d(values.astype(jnp.int8), (c.block_k, c.block_n))
        return kernel(x2_p, codes, scales, zp, st)[: x2.shape[0], : values.shape[1]]

    @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
    def f(x2, values, scales, zp, st):
        return forward(x2, values, scales, zp, st)

    def fwd(x2, values, scales, zp, st):
        # a zero-size array carries x's dtype through the residuals (dtypes are not JAX types)
        return forward(x2, values, scales, zp, st), (values, scales, zp, jnp.zeros((0,), x2.dtype))

    def bwd(st, res, dout):
        values, scales, zp, dtype_carrier = res
        x_dtype = dtype_carrier.dtype
        w = base.dequantize(values, scales, zp, x_dtype)
        dx = jnp.matmul(dout.astype(x_dtype), w.T, preferred_element_type=jnp.float32)
        zeros = lambda a: None if a is None else jnp.zeros_like(a)
        return dx.astype(x_dtype), None, zeros(scales), zeros(zp)

    f.defvjp(fwd, bwd)
    return f


def pad2d(a, multiples, rows: int | None = None):
    """Zero-pads a 2-D array up to multiples of the blocks (or to exactly `rows` rows), since
    both kernels tile x, values and scales in whole blocks."""
    pad_rows = (rows - a.shape[0]) if rows is not None else -a.shape[0] % multiples[0]
    return jnp.pad(a, ((0, pad_rows), (0, -a.shape[1] % multiples[1])))


def flatten_rows(x):
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
