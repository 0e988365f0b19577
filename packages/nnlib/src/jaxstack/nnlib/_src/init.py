"""Parameter initialisers compiled once per shape.

Eager `jax.random.normal` dispatches (and compiles) its several primitives one by one; a jitted
initialiser is one small program per distinct shape, which makes building a model several
times faster on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "std"))
def normal(
    key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32, std: float = 1.0
) -> jax.Array:
    """N(0, std^2) samples of `shape`, cast to `dtype`."""
    return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)
