"""Facts about the device JAX computes on: the keys of implementation choice and tuning.

Normally the default device. Inside `aot.target_device(d)` it is `d` instead (a TPU device from
a topology description, say), so that dispatch chooses, and tuning looks up, for the chip a
program is being compiled for rather than for the CPU that compiles it.
"""

from __future__ import annotations

import contextvars

import jax

_TARGET: contextvars.ContextVar[jax.Device | None] = contextvars.ContextVar(
    "jaxstack_kernlib_target_device", default=None
)


def default_device() -> jax.Device:
    return _TARGET.get() or jax.devices()[0]


def platform() -> str:
    """'cpu', 'gpu' or 'tpu' for the default backend (CUDA and ROCm are both 'gpu')."""
    name = default_device().platform
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


def device_kind() -> str:
    """The device kind JAX reports ('cpu', 'NVIDIA H100 80GB HBM3', 'TPU v5 lite', ...)."""
    return default_device().device_kind
