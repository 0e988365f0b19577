"""Quantized matmul: `x @ dequantize(w)`, recognising the quantised-tensor PyTree structurally.

A quantised weight is any object with these attributes (quantlib's registered PyTree node is
one; kernlib never imports quantlib):

- `values`: int8 or int4 array [K, N] (the integer codes, logical shape);
- `scales`: float array [K // tile_k, N] (per-tile along K) or [1, N] / [N] (per channel);
- `zero_points` (optional, may be None): same shape as `scales`, in the integer domain;
- `dtype`: the dense dtype it came from; `shape`: the dense shape (K, N).

`dequantize(w)[k, n] = (values[k, n] - zero_points[k // tile_k, n]) * scales[k // tile_k, n]`.
Weights are constants here: gradients flow to `x` only (in every implementation).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.kernlib._src.errors import ConfigError
from jaxstack.kernlib._src.spec import spec_key


class Parts(NamedTuple):
    values: Any
    scales: Any  # [n_tiles, N]
    zero_points: Any  # [n_tiles, N] or None
    dtype: Any
    shape: tuple[int, int]


def is_quantized(w) -> bool:
    return hasattr(w, "values") and hasattr(w, "scales")


def parts(w) -> Parts:
    """Reads and checks the quantised-tensor structure (clear errors for each field)."""
    if not is_quantized(w):
        raise ConfigError(
            f"quantized_matmul needs a quantised tensor (attributes values, scales, optional "
            f"zero_points, dtype, shape), got {type(w).__name__}"
        )
    values, scales = w.values, w.scales
    zp = getattr(w, "zero_points", None)
    if values.ndim != 2:
        raise ConfigError(f"values must be [K, N], got shape {values.shape}")
    if jnp.dtype(values.dtype) not in (jnp.dtype(jnp.int8), jnp.dtype(jnp.int4)):
        raise ConfigError(f"values dtype must be int8 or int4, got {values.dtype}")
    k, n = values.shape
    if scales.ndim == 1:
        scales = scales.reshape(1, -1)
    if scales.ndim != 2 or scales.shape[1] != n or k % scales.shape[0]:
        raise ConfigError(
            f"scales must be [K // tile_k, N] with tile_k dividing K={k} and N={n}; "
            f"got {scales.shape}"
        )
    if zp is not None:
        zp = zp.reshape(scales.shape) if zp.size == scales.size else zp
        if zp.shape != scales.shape:
            raise ConfigError(f"zero_points must match scales {scales.shape}, got {zp.shape}")
    dtype = getattr(w, "dtype", None) or scales.dtype
    shape = tuple(getattr(w, "shape", (k, n)))
    if shape != (k, n):
        raise ConfigError(f"quantised tensor shape {shape} disagrees with values {values.shape}")
    return Parts(values, scales, zp, dtype, (k, n))


def dequantize(values, scales, zero_points, dtype):
    """The dense weight [K, N] from integer codes, per-tile scales and optional zero points.

    `w[k, n] = (values[k, n] - zero_points[k // tile_k, n]) * scales[k // tile_k, n]`, computed in
    float32 and cast to `dtype`; `tile_k` is K over the number of scale rows (K for per-channel
    scales of shape [1, N]).

    Args:
      values: the integer codes [K, N] (int4 codes unpacked).
      scales: float [K // tile_k, N].
      zero_points: the same shape as `scales`, in the integer domain, or None (symmetric).
      dtype: the dtype of the result.
    """
    k = values.shape[0]
    reps = k // scales.shape[0]
    w = values.astype(jnp.float32)
    if zero_points is not None:
        w = w - jnp.repeat(zero_points.astype(jnp.float32), reps, axis=0)
    return (w * jnp.repeat(scales.astype(jnp.float32), reps, axis=0)).astype(dtype)


def reference(x, values, scales, zero_points=None, *, out_dtype=None):
    """x @ dequantize(w) with f32 accumulation; the weights are constants (no gradient)."""
    w = dequantize(values, scales, zero_points, x.dtype)
    w = jax.lax.stop_gradient(w)
    out = jnp.matmul(x, w, preferred_element_type=jnp.float32)
    return out.astype(out_dtype or x.dtype)


def validate(x, p: Parts) -> None:
    if x.shape[-1] != p.shape[0]:
        raise ConfigError(f"x's last axis {x.shape[-1]} must equal the weight's K={p.shape[0]}")


def spec(x, values, scales, zero_points=None, **options) -> str:
    return spec_key(
        {"x": x, "values": values, "scales": scales},
        {"zero_points": zero_points is not None},
    )


def quantize(w, *, bits: int = 8, tile: int | None = None, symmetric: bool = True):
    """A reference quantiser for tests and benchmarks: returns (values, scales, zero_points).

    Per-channel when tile is None, else per tile of `tile` rows along K.
    """
    w = np.asarray(w, np.float32)
    k, n = w.shape
    tile = tile or k
    wt = w.reshape(k // tile, tile, n)
    qmax = 2 ** (bits - 1) - 1
    if symmetric:
        scale = np.maximum(np.abs(wt).max(axis=1), 1e-8) / qmax
        q = np.clip(np.round(wt / scale[:, None]), -qmax - 1, qmax)
        zp = None
    else:
        lo, hi = wt.min(axis=1), wt.max(axis=1)
        scale = np.maximum(hi - lo, 1e-8) / (2 * qmax + 1)
        zp = np.round(-qmax - 1 - lo / scale)
        q = np.clip(np.round(wt / scale[:, None]) + zp[:, None], -qmax - 1, qmax)
    dtype = jnp.int8 if bits == 8 else jnp.int4
    values = jnp.asarray(q.reshape(k, n).astype(np.int8)).astype(dtype)
    return values, jnp.asarray(scale), None if zp is None else jnp.asarray(zp)


class _Example(NamedTuple):
    values: Any
    scales: Any
    zero_points: Any
    dtype: Any
    shape: tuple[int, int]


def example(dims: dict[str, int], dtype: str = "bfloat16", seed: int = 0):
    m, k, n = dims.get("m", 16), dims.get("k", 4096), dims.get("n", 4096)
    bits, tile = dims.get("bits", 8), dims.get("tile", 0) or None
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (m, k), dtype)
    w = jax.random.normal(kw, (k, n), jnp.float32) / math.sqrt(k)
    values, scales, zp = quantize(w, bits=bits, tile=tile)
    return (x, values, scales.astype(dtype), zp), {"out_dtype": None}


def timed(fn):
    return fn
