"""Curated kernels for LLM training and serving, one API per op, several implementations each.

Each op has an XLA reference (runs everywhere) and Pallas kernels for GPU (Triton) and TPU
(Mosaic); `implementation=None` picks the best known one for the device and shapes (a tuned
winner from `jaxstack-kern autotune`, else the platform's preference) and falls back to `xla`
with a one-time log line saying why. On CPU it runs `xla`, but for ragged paged attention's
C++ custom call `ffi_cpu` (built for the host CPU at first use, where a C++ compiler is found).

    >>> from jaxstack import kernlib
    >>> out = kernlib.attention(q, k, v, segment_ids=segment_ids)  # nnlib's attention_fn
"""

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.kernlib, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.aot_cases": ["AotCase", "aot_cases"],
        "_src.aot": [
            "AotResult",
            "TPU_TARGETS",
            "TpuTarget",
            "aot_compile",
            "target_device",
            "tpu_devices",
        ],
        "_src.autotune": ["autotune"],
        "_src.errors": ["ConfigError", "Error", "TuningCacheError", "UnsupportedError"],
        "_src.registry": ["OP_NAMES", "implementations", "which_implementation"],
        "_src.tuning": ["TuningCache", "user_cache_path"],
        "ops.attention.api": ["attention"],
        "ops.grouped_matmul.api": ["grouped_matmul"],
        "ops.quantized_matmul.api": ["quantized_matmul"],
        "ops.quantized_matmul.base": ["dequantize", "quantize"],
        "ops.ragged_paged_attention.api": ["ragged_paged_attention"],
        "ops.rms_norm.api": ["rms_norm"],
    },
)
