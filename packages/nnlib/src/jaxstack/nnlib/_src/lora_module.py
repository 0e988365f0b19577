"""The LoRA adapter module attached to a Dense: y += dropout(x) @ a @ b * alpha / rank."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstack.nnlib._src.init import normal


class LoRAKey(nnx.Variable):
    """Raw PRNG key data for LoRA dropout (not a parameter, not trained)."""


class LoRA(nnx.Module):
    """Low-rank update of a [in, out] kernel; `lead` are leading stacked-layer dims.

    `b` starts at zero, so attaching an adapter leaves the model's outputs unchanged. Dropout
    runs only after `set_lora_dropout_rng` (or `apply(..., dropout_rng=key)`) supplied a key.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        lead: tuple[int, ...] = (),
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        none = (None,) * 2
        a = normal(rngs.params(), (*lead, in_dim, rank), param_dtype, in_dim**-0.5)
        self.a = nnx.LoRAParam(a, logical_axes=none)
        self.b = nnx.LoRAParam(jnp.zeros((*lead, rank, out_dim), param_dtype), logical_axes=none)
        self.rank, self.alpha, self.rate, self.dtype = rank, float(alpha), float(dropout), dtype
        self.dropout_key = LoRAKey(jnp.zeros((*lead, 2), jnp.uint32))
        self.dropout_active = False

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def delta(self) -> jax.Array:
        """The dense kernel update a @ b * scale, shape [*lead, in, out]."""
        return (self.a[...] @ self.b[...]) * self.scale

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.dropout_active and self.rate > 0.0:
            key = jax.random.wrap_key_data(self.dropout_key[...])
            keep = jax.random.bernoulli(key, 1.0 - self.rate, x.shape)
            x = jnp.where(keep, x / (1.0 - self.rate), 0.0).astype(x.dtype)
        return (x @ self.a[...].astype(self.dtype)) @ self.b[...].astype(self.dtype) * self.scale
