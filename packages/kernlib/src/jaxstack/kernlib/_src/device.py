"""Facts about the device JAX computes on: the keys of implementation choice and tuning."""

from __future__ import annotations

import jax


def default_device() -> jax.Device:
    return jax.devices()[0]


def platform() -> str:
    """'cpu', 'gpu' or 'tpu' for the default backend (CUDA and ROCm are both 'gpu')."""
    name = default_device().platform
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


def device_kind() -> str:
    """The device kind JAX reports ('cpu', 'NVIDIA H100 80GB HBM3', 'TPU v5 lite', ...)."""
    return default_device().device_kind
