"""`attention`: the public function, and the op's table of implementations."""

from __future__ import annotations

from jaxstack.kernlib._src import dispatch
from jaxstack.kernlib.ops.attention import base, pallas_mosaic_tpu, pallas_triton, xla

OP = dispatch.Op.from_modules("attention", base, xla, pallas_triton, pallas_mosaic_tpu)


@dispatch.public
def attention(
    q,
    k,
    v,
    *,
    segment_ids=None,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    scale: float | None = None,
    implementation: str | None = None,
    config=None,
    interpret: bool = False,
):
    """Multi-head self-attention with GQA, packed segments, sliding window and soft-cap.

    The nnlib attention-function contract, so `Transformer(cfg, rngs=..., attention_fn=attention)`
    works unchanged. Differentiable (the Pallas kernels have a custom VJP).

    Args:
      q: [B, T, Hq, D]. k, v: [B, T, Hkv, D] with Hq a multiple of Hkv.
      segment_ids: optional int [B, T]; tokens attend only within their segment, and segment 0
        (padding) attends to nothing and is attended by nothing (its output is 0).
      causal: query i reads keys j <= i.
      sliding_window: query i reads only keys with i - j < sliding_window.
      logits_soft_cap: c replaces logits by c * tanh(logits / c).
      scale: logit scale, default 1 / sqrt(D).
      implementation: None (best known for this device and shapes, falling back to "xla"),
        "xla", "pallas_triton" or "pallas_mosaic_tpu".
      config: block sizes for the chosen Pallas implementation (its `Config` or a dict);
        default: the tuning cache's winner, else the implementation's defaults.
      interpret: run a Pallas implementation in the Pallas interpreter (CPU tests).

    Returns:
      [B, T, Hq, D] in q's dtype.

    Example:
      >>> out = attention(q, k, v, segment_ids=segment_ids, sliding_window=4096)
    """
    base.validate(q, k, v, segment_ids, sliding_window, logits_soft_cap)
    options = dict(
        causal=causal, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, scale=scale
    )
    return dispatch.Call(OP, (q, k, v, segment_ids), options, implementation, config, interpret)
