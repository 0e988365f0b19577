"""QuantizedTensor: the quantised-weight PyTree node of docs/conventions.md.

A weight of shape `shape` whose first `contract_ndim` axes are contracted by its matmul is stored
as a [K, N] matrix (K = the contracted size): integer (or fp8, or NF4-index) codes in `values`
and one scale per output channel and per tile of `K // scales.shape[0]` rows in `scales`. 4-bit
codes are packed two per byte along K, so `values` is [K / 2, N] uint8 for int4 and nf4.

Inside a module's own code the tensor behaves like the weight it replaces just enough for
`x @ kernel.astype(dtype).reshape(K, N)` (what nnlib's Dense does) to run the quantised matmul:
`astype` and `reshape` return a `MatmulOperand`, and Python hands `x @ operand` to the operand's
`__rmatmul__` because jax arrays decline unknown right operands.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxstack.quantlib._src import calibration, qtypes
from jaxstack.quantlib._src.errors import RuleError
from jaxstack.quantlib._src.matmul import quantized_matmul


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedTensor:
    """Codes, scales and optional zero points of one weight, plus what it was.

    Attributes:
      values: codes [K, N] (int8, float8) or [K / 2, N] uint8 for the packed 4-bit formats.
      scales: float32 [K // tile, N]; [1, N] is per output channel.
      zero_points: None (quantlib's formats are symmetric), kept for asymmetric producers.
      qtype: the format's name (`int8`, `int4`, `fp8_e4m3`, `fp8_e5m2`, `nf4`).
      dtype: the dense weight's dtype; `shape`: its shape.
      contract_ndim: how many leading axes of `shape` the matmul contracts (K is their size).
    """

    values: jax.Array
    scales: jax.Array
    zero_points: jax.Array | None
    qtype: str = dataclasses.field(metadata=dict(static=True))
    dtype: Any = dataclasses.field(metadata=dict(static=True))
    shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    contract_ndim: int = dataclasses.field(default=1, metadata=dict(static=True))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def matrix_shape(self) -> tuple[int, int]:
        c = self.contract_ndim
        return math.prod(self.shape[:c]), math.prod(self.shape[c:])

    @property
    def tile_size(self) -> int:
        return self.matrix_shape[0] // self.scales.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in jax.tree.leaves(self))

    def codes(self) -> jax.Array:
        """The [K, N] codes, unpacked."""
        q = qtypes.QTYPES[self.qtype]
        return qtypes.unpack(self.values, q) if q.packed else self.values

    def dequantize_matrix(self) -> jax.Array:
        """The [K, N] float32 weight the codes stand for."""
        k, n = self.matrix_shape
        levels = qtypes.decode(self.codes(), qtypes.QTYPES[self.qtype])
        blocks = levels.reshape(self.scales.shape[0], -1, n)
        if self.zero_points is not None:
            blocks = blocks - self.zero_points[:, None, :]
        return (blocks * self.scales[:, None, :]).reshape(k, n)

    def dequantize(self) -> jax.Array:
        """The dense weight (original shape and dtype)."""
        return self.dequantize_matrix().reshape(self.shape).astype(self.dtype)

    # The weight protocol a module's own matmul code uses (see the module docstring).
    def __getitem__(self, index: Any) -> QuantizedTensor:
        if index is not Ellipsis:
            raise TypeError("a QuantizedTensor is read whole (`var[...]`); call dequantize()")
        return self

    def astype(self, dtype: Any) -> MatmulOperand:
        return MatmulOperand(self, jnp.dtype(dtype), self.shape)

    def reshape(self, *shape: Any) -> MatmulOperand:
        return self.astype(self.dtype).reshape(*shape)

    def __rmatmul__(self, x: jax.Array) -> jax.Array:
        return self.astype(self.dtype).__rmatmul__(x)


class MatmulOperand:
    """A quantised weight on its way into `x @ w` in a module's code (cast/reshape recorded)."""

    def __init__(self, tensor: QuantizedTensor, dtype: Any, shape: tuple[int, ...]):
        self.tensor, self.dtype, self.shape = tensor, dtype, tuple(shape)

    def astype(self, dtype: Any) -> MatmulOperand:
        return MatmulOperand(self.tensor, jnp.dtype(dtype), self.shape)

    def reshape(self, *shape: Any) -> MatmulOperand:
        shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        if shape not in (self.tensor.shape, self.tensor.matrix_shape):
            raise RuleError(
                f"a quantised weight of shape {self.tensor.shape} can be viewed as itself or "
                f"as its matrix {self.tensor.matrix_shape}, not {shape}"
            )
        return MatmulOperand(self.tensor, self.dtype, shape)

    def __rmatmul__(self, x: jax.Array) -> jax.Array:
        if self.shape != self.tensor.matrix_shape:
            raise RuleError(
                f"x @ w needs the quantised weight as its [K, N] matrix "
                f"{self.tensor.matrix_shape}, got the view {self.shape}"
            )
        return quantized_matmul(x.astype(self.dtype), self.tensor)


def quantize_tensor(
    w: jax.Array,
    qtype: str,
    *,
    contract_ndim: int = 1,
    tile_size: int | None = None,
    calibration_method: str = "absmax",
) -> QuantizedTensor:
    """Quantise a dense weight: one scale per output channel and per tile of K rows.

    Args:
      w: the weight; its first `contract_ndim` axes are contracted by the matmul.
      qtype: a format of `QTYPES`.
      tile_size: rows of K sharing a scale (None: all of K, i.e. per channel).
      calibration_method: "absmax", "rms,K" or "percentile,P" (see calibration.py).
    """
    q = qtypes.get_qtype(qtype, "weight_qtype")
    shape = tuple(w.shape)
    k, n = math.prod(shape[:contract_ndim]), math.prod(shape[contract_ndim:])
    tile = tile_size or k
    if k % tile:
        raise RuleError(f"tile_size={tile_size} does not divide the contracted size {k}")
    blocks = w.astype(jnp.float32).reshape(k // tile, tile, n)
    bound = calibration.bound_fn(calibration_method)(jnp.abs(blocks), axis=1, keepdims=False)
    scales = jnp.where(bound > 0, bound / q.scale_bound, 1.0).astype(jnp.float32)
    codes = qtypes.encode(blocks / scales[:, None, :], q).reshape(k, n)
    values = qtypes.pack(codes) if q.packed else codes
    return QuantizedTensor(values, scales, None, q.name, jnp.dtype(w.dtype), shape, contract_ndim)


def fake_quantize(w: jax.Array, qtype: str, **options: Any) -> jax.Array:
    """w -> dequantize(quantize(w)) with a straight-through gradient (identity backward).

    The forward value is exactly what the PTQ form computes with, which is why a model trained
    with it converts to PTQ with no further change in its outputs.
    """
    deq = quantize_tensor(w, qtype, **options).dequantize()
    return w + jax.lax.stop_gradient(deq - w)


def fake_quantize_activation(
    x: jax.Array, qtype: str, calibration_method: str, scale: jax.Array | None = None
) -> jax.Array:
    """Quantise-dequantise activations: per token (last axis) when `scale` is None, else with
    the static calibrated `scale`; straight-through gradient."""
    q = qtypes.get_qtype(qtype, "act_qtype", weights=False)
    xf = x.astype(jnp.float32)
    if scale is None:
        bound = calibration.bound_fn(calibration_method)(jnp.abs(xf), axis=-1, keepdims=True)
        scale = jnp.where(bound > 0, bound / q.scale_bound, 1.0)
    deq = (qtypes.decode(qtypes.encode(xf / scale, q), q) * scale).astype(x.dtype)
    return x + jax.lax.stop_gradient(deq - x)
