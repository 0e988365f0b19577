"""`x @ w` for a quantised weight: kernlib's quantized_matmul where it applies.

kernlib's op takes int8/int4 codes with per-channel or per-tile scales (its XLA implementation
on CPU, Pallas kernels on GPU/TPU); the fp8 and NF4 formats are dequantised and multiplied
here, which XLA fuses into one loop over the codes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from jaxstack import kernlib


class QuantizedMatrix(Protocol):
    """What the matmul reads of a quantised weight (a QuantizedTensor): its format, its codes
    and scales as a [K, N] matrix, or the dequantised matrix. Declared here so that the tensor
    module can import this one, and not the other way round."""

    qtype: str
    scales: jax.Array
    zero_points: Any
    dtype: Any
    matrix_shape: tuple[int, int]

    def codes(self) -> jax.Array: ...

    def dequantize_matrix(self) -> jax.Array: ...


class _Matrix(NamedTuple):
    """The [K, N] view of a QuantizedTensor that kernlib reads structurally."""

    values: jax.Array
    scales: jax.Array
    zero_points: Any
    dtype: Any
    shape: tuple[int, int]


def quantized_matmul(x: jax.Array, w: QuantizedMatrix) -> jax.Array:
    """x [..., K] @ w [K, N] -> [..., N] in x's dtype."""
    if w.qtype in ("int8", "int4"):
        view = _Matrix(w.codes(), w.scales, w.zero_points, w.dtype, w.matrix_shape)
        return kernlib.quantized_matmul(x, view, out_dtype=x.dtype)
    dense = jax.lax.stop_gradient(w.dequantize_matrix().astype(x.dtype))
    return jnp.matmul(x, dense, preferred_element_type=jnp.float32).astype(x.dtype)
