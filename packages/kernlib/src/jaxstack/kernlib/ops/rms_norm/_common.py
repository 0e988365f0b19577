"""Shared by the Pallas RMS-norm backends: static options, flattening rows, padding, the custom
VJP wiring."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Static:
    """Compile-time options of one call (hashable: the custom VJP's non-differentiable arg)."""

    dim: int  # true feature width (the mean's divisor, whatever the padding)
    eps: float
    offset: float
    config: Any  # the backend's own Config
    interpret: bool


def as_rows(x, weight, block_rows: int, pad_dim_to: int | None = None):
    """x [..., D] -> zero-padded [R, Dp] and weight [Dp] (ones when None)."""
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    x2 = x.reshape(rows, d)
    w = jnp.ones((d,), x.dtype) if weight is None else weight
    dp = d if pad_dim_to is None else pad_dim_to
    x2 = jnp.pad(x2, ((0, -rows % block_rows), (0, dp - d)))
    return x2, jnp.pad(w, (0, dp - d)), rows


def make_fused(forward, backward):
    """Builds a custom-VJP function f(x2, w, static) from pallas forward/backward callables."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
    def fused(x2, w, static):
        return forward(x2, w, static)

    def fwd(x2, w, static):
        return forward(x2, w, static), (x2, w)

    def bwd(static, res, dy):
        x2, w = res
        dx, dw_partial = backward(x2, w, dy, static)
        return dx, jnp.sum(dw_partial, axis=0).astype(w.dtype)

    fused.defvjp(fwd, bwd)
    return fused
