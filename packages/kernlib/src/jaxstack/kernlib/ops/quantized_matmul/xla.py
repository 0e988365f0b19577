"""The XLA implementation: a dot against the dequantised weight, streamed by K rows for small M.

XLA:CPU does not fuse a convert into a dot: `x @ dequantize(w)` writes the whole float weight
to memory and reads it back, so at decode (a few rows of x, a memory-bound GEMV) int8 weights
ran at half the speed of float32 ones. For up to `STREAMED_MAX_ROWS` rows on CPU the product is
instead a loop over K in chunks of rows: each step dequantises one [chunk, N] slice of the codes
(about `CHUNK_BYTES` of float, so it stays in L1/L2) and accumulates `x[:, chunk] @ slice`. The
float weight never exists whole; the step reads the integer codes once. Above that many rows
(prefill, training) one dot wins again and is kept; other platforms keep the dot (their
Pallas kernels are the fast path). benchmarks/quant records the crossover measurements.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxstack.kernlib.ops.quantized_matmul import base

STREAMED_MAX_ROWS = 16
CHUNK_BYTES = 64 * 1024


def chunk_rows(k: int, n: int, tile_k: int) -> int:
    """Rows per streamed step: a power of two near CHUNK_BYTES of float32 (at least 8), dividing
    the scale tile (so a chunk has one scale row) and hence K."""
    rows = max(8, 1 << max(0, (CHUNK_BYTES // (4 * n)).bit_length() - 1))
    return math.gcd(rows, tile_k, k)


def streamed(x, values, scales, zero_points=None, *, out_dtype=None):
    """`base.reference`, computed chunk by chunk along K (same numbers up to summation order)."""
    k, n = values.shape
    scales = scales.reshape(-1, n)
    tile = k // scales.shape[0]
    c = chunk_rows(k, n, tile)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    xs = x2.reshape(x2.shape[0], k // c, c).transpose(1, 0, 2)
    vs = values.reshape(k // c, c, n)
    scales = jax.lax.stop_gradient(scales)
    zp = None if zero_points is None else jax.lax.stop_gradient(zero_points.reshape(scales.shape))

    def step(acc, chunk):
        i, xc, vc = chunk
        row = i * c // tile
        s = jax.lax.dynamic_slice_in_dim(scales, row, 1)
        z = None if zp is None else jax.lax.dynamic_slice_in_dim(zp, row, 1)
        w = base.dequantize(vc, s, z, x.dtype)
        return acc + jnp.matmul(xc, w, preferred_element_type=jnp.float32), None

    acc = jnp.zeros((x2.shape[0], n), jnp.float32)
    acc, _ = jax.lax.scan(step, acc, (jnp.arange(k // c), xs, vs))
    return acc.astype(out_dtype or x.dtype).reshape(*lead, n)


def run(x, values, scales, zero_points=None, *, config=None, interpret=False, **options):
    del config, interpret
    rows = math.prod(x.shape[:-1])
    if rows > STREAMED_MAX_ROWS:
        return base.reference(x, values, scales, zero_points, **options)
    return jax.lax.platform_dependent(
        x,
        values,
        scales,
        zero_points,
        cpu=lambda *a: streamed(*a, **options),
        default=lambda *a: base.reference(*a, **options),
    )
