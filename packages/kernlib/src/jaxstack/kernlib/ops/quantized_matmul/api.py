"""`quantized_matmul`: the public function, and the op's table of implementations."""

from __future__ import annotations

from jaxstack.kernlib._src import dispatch
from jaxstack.kernlib.ops.quantized_matmul import base, pallas_mosaic_tpu, pallas_triton, xla

OP = dispatch.Op.from_modules("quantized_matmul", base, xla, pallas_triton, pallas_mosaic_tpu)


@dispatch.public
def quantized_matmul(
    x,
    w,
    *,
    out_dtype=None,
    implementation: str | None = None,
    config=None,
    interpret: bool = False,
):
    """`x @ dequantize(w)` for int8 / int4 weights with per-channel or per-tile scales.

    `w` is recognised structurally (attributes `values`, `scales`, optional `zero_points`,
    `dtype`, `shape`; see docs/kernlib.md), so quantlib's tensors work without kernlib
    importing quantlib. Gradients flow to `x` only; the weights are constants.

    Args:
      x: [..., K] activations. w: quantised [K, N] weight.
      out_dtype: output dtype (default x's dtype).
      implementation, config, interpret: as for `attention`.

    Returns:
      [..., N].

    Example:
      >>> y = quantized_matmul(hidden, params["mlp/up/kernel"])  # a quantlib tensor
    """
    p = base.parts(w)
    base.validate(x, p)
    arrays = (x, p.values, p.scales, p.zero_points)
    return dispatch.Call(OP, arrays, dict(out_dtype=out_dtype), implementation, config, interpret)
