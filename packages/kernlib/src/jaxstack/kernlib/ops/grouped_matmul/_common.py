"""The static options and custom VJP shared by the Pallas grouped-matmul backends.

d_lhs is itself a grouped matmul against rhs transposed; d_rhs is the "transposed" grouped
matmul (per group, lhs_g^T @ d_out_g), a second kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Static:
    """Compile-time options of one call (hashable: the custom VJP's non-differentiable arg)."""

    config: Any  # the backend's own Config
    out_dtype: str
    interpret: bool

    def for_grad(self, dtype):
        """Options for the d_lhs grouped matmul: it accumulates and returns f32."""
        return dataclasses.replace(self, out_dtype=jnp.dtype(jnp.float32).name)


def make_differentiable(gmm, tgmm):
    """gmm(lhs, rhs, sizes, st) -> out; tgmm(lhs, dout, sizes, st) -> [G,K,N] (f32)."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
    def f(lhs, rhs, group_sizes, st):
        return gmm(lhs, rhs, group_sizes, st)

    def fwd(lhs, rhs, group_sizes, st):
        return gmm(lhs, rhs, group_sizes, st), (lhs, rhs, group_sizes)

    def bwd(st, res, dout):
        lhs, rhs, group_sizes = res
        d_lhs = gmm(
            dout.astype(rhs.dtype), jnp.swapaxes(rhs, 1, 2), group_sizes, st.for_grad(lhs.dtype)
        )
        d_rhs = tgmm(lhs, dout, group_sizes, st)
        return d_lhs.astype(lhs.dtype), d_rhs.astype(rhs.dtype), None

    f.defvjp(fwd, bwd)
    return f
