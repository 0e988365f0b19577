"""RMSNorm, including Gemma's (1 + w) variant; statistics always in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, or * (1 + scale) when `plus_one` (Gemma; scale starts at 0).

    Args:
      dim: size of the normalised (last) axis.
      axis_name: its logical axis name ("embed", or "head_dim" for q/k norms).
    """

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-6,
        plus_one: bool = False,
        axis_name: str = "embed",
        param_dtype=jnp.float32,
    ):
        self.eps = eps
        self.plus_one = plus_one
        init = jnp.zeros if plus_one else jnp.ones
        self.scale = nnx.Param(init((dim,), param_dtype), logical_axes=(axis_name,))

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        w = self.scale[...].astype(jnp.float32)
        if self.plus_one:
            return (xf * (1.0 + w)).astype(dtype)
        # Llama casts the normalised activations back before scaling; keep that order for parity.
        return (w.astype(dtype) * xf.astype(dtype)).astype(dtype)
