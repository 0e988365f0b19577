"""RMS norm: `y = x / sqrt(mean(x^2, -1) + eps) * (weight_offset + weight)`, statistics in f32.

`weight_offset=1.0` gives the Gemma convention (weights stored as deviations from 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxstack.kernlib._src.errors import ConfigError
from jaxstack.kernlib._src.spec import spec_key


def validate(x, weight, eps) -> None:
    if x.ndim < 1:
        raise ConfigError(f"rms_norm needs x with a feature axis, got shape {x.shape}")
    if weight is not None and tuple(weight.shape) != (x.shape[-1],):
        raise ConfigError(
            f"weight must have shape ({x.shape[-1]},) to match x's last axis, got {weight.shape}"
        )
    if not eps > 0:
        raise ConfigError(f"eps={eps!r} must be > 0")


def reference(x, weight=None, *, eps: float = 1e-6, weight_offset: float = 0.0):
    xf = x.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    y = xf * rstd
    if weight is not None:
        y = y * (weight_offset + weight.astype(jnp.float32))
    return y.astype(x.dtype)


def spec(x, weight=None, **options) -> str:
    return spec_key({"x": x, "weight": weight}, {})


def example(dims: dict[str, int], dtype: str = "bfloat16", seed: int = 0):
    rows, d = dims.get("rows", 8192), dims.get("dim", 4096)
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (rows, d), dtype)
    w = 1.0 + 0.1 * jax.random.normal(kw, (d,), dtype)
    return (x, w), {"eps": 1e-6, "weight_offset": 0.0}


def timed(fn):
    def loss(x, w):
        return jnp.sum(fn(x, w).astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1))
