"""`rms_norm`: the public function, and the op's table of implementations."""

from __future__ import annotations

from jaxstack.kernlib._src import dispatch
from jaxstack.kernlib.ops.rms_norm import base, pallas_mosaic_tpu, pallas_triton, xla

OP = dispatch.Op.from_modules("rms_norm", base, xla, pallas_triton, pallas_mosaic_tpu)


@dispatch.public
def rms_norm(
    x,
    weight=None,
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    implementation: str | None = None,
    config=None,
    interpret: bool = False,
):
    """Fused RMS norm over the last axis: `x / rms(x) * (weight_offset + weight)`.

    Statistics are computed in float32 whatever x's dtype; the output has x's dtype.
    Differentiable in x and weight (the Pallas kernels fuse the backward too).

    Args:
      x: [..., D]. weight: [D] or None (no scaling).
      eps: added to the mean square. weight_offset: 1.0 for Gemma-style weights.
      implementation, config, interpret: as for `attention`.

    Example:
      >>> y = rms_norm(hidden, params["norm/scale"], eps=1e-5)
    """
    base.validate(x, weight, eps)
    options = dict(eps=eps, weight_offset=weight_offset)
    return dispatch.Call(OP, (x, weight), options, implementation, config, interpret)
