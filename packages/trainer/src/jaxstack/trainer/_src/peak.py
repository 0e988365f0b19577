"""Device peak FLOP/s, the denominator of MFU.

Accelerators use their published dense peak (a spec table keyed by `device_kind`). A CPU has no
useful spec number (cores, clocks, AMX and the BLAS in use all matter), so the trainer measures
the best matmul throughput XLA reaches on it for the compute dtype, caches it as JSON keyed by CPU
model, core count, dtype and jax version, and states in the log where the number came from. A
machine busy with other work measures low, so each run measures again and the cache keeps the
best value; `log.peak_flops` overrides it.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp

# Dense peak FLOP/s per chip: (bfloat16, float32). float32 on GPUs is the TF32 tensor-core rate,
# which is what XLA uses for f32 matmuls at default precision.
SPEC_TABLE: dict[str, tuple[float, float]] = {
    "B200": (2.25e15, 1.1e15),
    "H200": (989e12, 494e12),
    "H100": (989e12, 494e12),
    "GH200": (989e12, 494e12),
    "A100": (312e12, 156e12),
    "L40S": (362e12, 183e12),
    "L4": (121e12, 60e12),
    "A10G": (125e12, 62e12),
    "TPU v6": (918e12, 918e12),
    "TPU v5p": (459e12, 459e12),
    "TPU v5 lite": (197e12, 197e12),
    "TPU v5e": (197e12, 197e12),
    "TPU v4": (275e12, 275e12),
}


@dataclass(frozen=True)
class DevicePeak:
    """Peak FLOP/s of one device for one dtype, and where the number came from."""

    flops_per_sec: float
    source: str  # "spec table (H100)", "measured matmul 1024^3 float32 (cached)", "config"
    device_kind: str
    dtype: str

    def describe(self) -> str:
        return (
            f"device peak {self.flops_per_sec / 1e9:,.0f} GFLOP/s per device "
            f"({self.dtype}, {self.device_kind}: {self.source})"
        )


def device_peak(
    dtype: str = "float32",
    device: jax.Device | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    override: float | None = None,
) -> DevicePeak:
    """Peak FLOP/s per device: `override`, else the spec table, else a (cached) CPU measurement."""
    device = device or jax.devices()[0]
    kind = device.device_kind
    if override:
        return DevicePeak(float(override), "set in config (log.peak_flops)", kind, dtype)
    for name, (bf16, f32) in SPEC_TABLE.items():
        if name.lower() in kind.lower():
            value = bf16 if dtype == "bfloat16" else f32
            return DevicePeak(value, f"spec table ({name} dense)", kind, dtype)
    if device.platform != "cpu":
        msg = f"no spec entry for {kind!r}; set log.peak_flops to its peak FLOP/s"
        return DevicePeak(float("nan"), msg, kind, dtype)
    return _measured_cpu_peak(dtype, device, cache_dir)


def _cpu_name() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _measured_cpu_peak(dtype: str, device: jax.Device, cache_dir) -> DevicePeak:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = _cpu_name()
    key = f"{cpu}|{cores} cores|{dtype}|jax {jax.__version__}"
    cache = pathlib.Path(cache_dir or _default_cache_dir()) / "device_peak.json"
    table: dict[str, float] = {}
    try:
        table = json.loads(cache.read_text())
    except (OSError, ValueError):
        table = {}
    # A measurement on a busy machine can only come out low, so every run measures again (well
    # under a second) and the cache keeps the best value seen on this machine.
    measured = measure_matmul_peak(dtype, device)
    value = max(measured, table.get(key, 0.0))
    table[key] = value
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(cache)
    except OSError:
        pass
    source = f"best measured XLA matmul peak (now {measured / 1e9:,.0f}), cached in {cache}"
    return DevicePeak(value, source, cpu, dtype)


def measure_matmul_peak(dtype: str = "float32", device: jax.Device | None = None) -> float:
    """Best FLOP/s of a jitted square matmul chain on `device` (a few hundred ms)."""
    n = 1024
    dt = jnp.dtype(dtype)
    device = device or jax.devices()[0]
    a = jax.device_put(jnp.ones((n, n), dt) / n, device)
    b = jax.device_put(jnp.ones((n, n), dt), device)
    reps = 8

    @jax.jit
    def chain(a, b):
        x = a
        for _ in range(reps):
            x = (x @ b) * (1.0 / n)
        return x

    chain(a, b).block_until_ready()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        chain(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 * reps / best


def _default_cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "jaxstack"
