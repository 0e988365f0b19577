"""Test setup: 4 virtual CPU devices (sharding tests), set before JAX is imported."""

import os
import sys

if "jax" not in sys.modules:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=4".strip()
sys.path.insert(0, os.path.dirname(__file__))
