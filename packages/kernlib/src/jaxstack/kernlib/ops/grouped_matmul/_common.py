"""The static options, operand padding and custom VJP shared by the Pallas grouped-matmul
backends.

d_lhs is itself a grouped matmul against rhs transposed; d_rhs is the "transposed" grouped
matmul (per group, lhs_g^T @ d_out_g), a second kernel. Both kernels see operands zero-padded
to whole blocks and return padded results, which are cut back here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxstack.kernlib.ops.grouped_matmul import base


@dataclasses.dataclass(frozen=True)
class Static:
    """Compile-time options of one call (hashable: the custom VJP's non-differentiable arg)."""

    config: Any  # the backend's own Config
    out_dtype: str
    interpret: bool

    def for_grad(self, dtype):
        """Options for the d_lhs grouped matmul: it accumulates and returns f32."""
        return dataclasses.replace(self, out_dtype=jnp.dtype(jnp.float32).name)


def make_differentiable(gmm_kernel, tgmm_kernel):
    """The differentiable grouped matmul f(lhs, rhs, group_sizes, st) from a backend's kernels,
    which take operands padded to whole blocks: gmm_kernel(lhs [Mp, Kp], rhs [G, Kp, Np],
    group_sizes, st) -> [Mp, Np] in st.out_dtype; tgmm_kernel(lhs [Mp, Kp], dout [Mp, Np],
    group_sizes, st) -> [G, Kp, Np] float32."""

    def gmm(lhs, rhs, group_sizes, st):
        c = st.config
        lhs_p = base.pad_to(lhs, (c.block_m, c.block_k))
        out = gmm_kernel(lhs_p, base.pad_to(rhs, (1, c.block_k, c.block_n)), group_sizes, st)
        return base.zero_tail(out[: lhs.shape[0], : rhs.shape[2]], group_sizes)

    def tgmm(lhs, dout, group_sizes, st):
        c = st.config
        lhs_p = base.pad_to(lhs, (c.block_m, c.block_k))
        dout_p = base.pad_to(dout.astype(lhs.dtype), (c.block_m, c.block_n))
        return tgmm_kernel(lhs_p, dout_p, group_sizes, st)[:, : lhs.shape[1], : dout.shape[1]]

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
