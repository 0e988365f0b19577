"""Curated kernels for LLM training and serving, one API per op, several implementations each.

Each op has an XLA reference (runs everywhere) and Pallas kernels for GPU (Triton) and TPU
(Mosaic); `implementation=None` picks the best known one for the device and shapes (a tuned
winner from `jaxstack-kern autotune`, else the platform's preference) and falls back to `xla`
with a one-time log line saying why. On CPU it always runs `xla`.

    >>> from jaxstack import kernlib
    >>> out = kernlib.attention(q, k, v, segment_ids=segment_ids)  # nnlib's attention_fn
"""

import importlib
from typing import Any

# public name -> the module (under the package) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.kernlib, or a command's --help, does not import JAX.
_EXPORTS = {
    "AotCase": "_src.aot_cases",
    "AotResult": "_src.aot",
    "TPU_TARGETS": "_src.aot",
    "TpuTarget": "_src.aot",
    "aot_cases": "_src.aot_cases",
    "aot_compile": "_src.aot",
    "target_device": "_src.aot",
    "tpu_devices": "_src.aot",
    "autotune": "_src.autotune",
    "ConfigError": "_src.errors",
    "Error": "_src.errors",
    "TuningCacheError": "_src.errors",
    "UnsupportedError": "_src.errors",
    "OP_NAMES": "_src.registry",
    "implementations": "_src.registry",
    "which_implementation": "_src.registry",
    "TuningCache": "_src.tuning",
    "user_cache_path": "_src.tuning",
    "attention": "ops.attention.api",
    "grouped_matmul": "ops.grouped_matmul.api",
    "quantized_matmul": "ops.quantized_matmul.api",
    "dequantize": "ops.quantized_matmul.base",
    "quantize": "ops.quantized_matmul.base",
    "ragged_paged_attention": "ops.ragged_paged_attention.api",
    "rms_norm": "ops.rms_norm.api",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
