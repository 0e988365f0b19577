"""Curated kernels for LLM training and serving, one API per op, several implementations each.

Each op has an XLA reference (runs everywhere) and Pallas kernels for GPU (Triton) and TPU
(Mosaic); `implementation=None` picks the best known one for the device and shapes (a tuned
winner from `jaxstack-kern autotune`, else the platform's preference) and falls back to `xla`
with a one-time log line saying why. On CPU it always runs `xla`.

    >>> from jaxstack import kernlib
    >>> out = kernlib.attention(q, k, v, segment_ids=segment_ids)  # nnlib's attention_fn
"""

from jaxstack.kernlib._src.autotune import autotune
from jaxstack.kernlib._src.errors import ConfigError, Error, TuningCacheError, UnsupportedError
from jaxstack.kernlib._src.registry import OP_NAMES, implementations, which_implementation
from jaxstack.kernlib._src.tuning import TuningCache, user_cache_path
from jaxstack.kernlib.ops.attention.api import attention
from jaxstack.kernlib.ops.grouped_matmul.api import grouped_matmul
from jaxstack.kernlib.ops.quantized_matmul.api import quantized_matmul
from jaxstack.kernlib.ops.quantized_matmul.base import dequantize, quantize
from jaxstack.kernlib.ops.ragged_paged_attention.api import ragged_paged_attention
from jaxstack.kernlib.ops.rms_norm.api import rms_norm

__all__ = [
    "OP_NAMES",
    "ConfigError",
    "Error",
    "TuningCache",
    "TuningCacheError",
    "UnsupportedError",
    "attention",
    "autotune",
    "dequantize",
    "grouped_matmul",
    "implementations",
    "quantize",
    "quantized_matmul",
    "ragged_paged_attention",
    "rms_norm",
    "user_cache_path",
    "which_implementation",
]
