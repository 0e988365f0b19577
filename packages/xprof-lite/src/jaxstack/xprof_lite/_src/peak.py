"""Device peaks for the roofline: a spec table for accelerators, a measured, cached number on CPU.

Spec values are dense (no sparsity) per-chip peaks from the vendors' data sheets: bf16 matrix
FLOP/s, f32 FLOP/s where it differs, and HBM bandwidth. A CPU has no useful data sheet number
(it depends on cores, SIMD width and what else runs), so it is measured once with a matmul and a
streaming copy and cached as JSON in the user's cache directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxstack.xprof_lite._src.errors import Error


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """Peak compute and memory bandwidth of one device."""

    name: str
    flops_per_s: float
    bytes_per_s: float
    source: str = "given"
    flops_per_s_f32: float | None = None

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte above which an op is compute-bound."""
        return self.flops_per_s / self.bytes_per_s

    def flops_for(self, dtype: str | None) -> float:
        if dtype in ("f32", "float32") and self.flops_per_s_f32:
            return self.flops_per_s_f32
        return self.flops_per_s

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DevicePeak:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


T, G = 1e12, 1e9
# (substring of jax's device_kind, lower case) -> (bf16 FLOP/s, f32 FLOP/s, HBM bytes/s).
# Checked in order: more specific names first.
SPEC_TABLE: tuple[tuple[str, float, float | None, float], ...] = (
    ("h200", 989 * T, 67 * T, 4800 * G),
    ("h100 pcie", 756 * T, 51 * T, 2000 * G),
    ("h100", 989 * T, 67 * T, 3350 * G),
    ("h800", 989 * T, 67 * T, 3350 * G),
    ("gh200", 989 * T, 67 * T, 4000 * G),
    ("b200", 2250 * T, 80 * T, 8000 * G),
    ("a100-sxm4-40gb", 312 * T, 19.5 * T, 1555 * G),
    ("a100-pcie-40gb", 312 * T, 19.5 * T, 1555 * G),
    ("a100", 312 * T, 19.5 * T, 2039 * G),
    ("l4", 121 * T, 30.3 * T, 300 * G),
    ("a10g", 70 * T, 31.2 * T, 600 * G),
    ("v100", 125 * T, 15.7 * T, 900 * G),
    ("tpu v6 lite", 918 * T, None, 1640 * G),
    ("tpu v6e", 918 * T, None, 1640 * G),
    ("tpu v5 lite", 197 * T, None, 819 * G),
    ("tpu v5e", 197 * T, None, 819 * G),
    ("tpu v5p", 459 * T, None, 2765 * G),
    ("tpu v5", 459 * T, None, 2765 * G),
    ("tpu v4", 275 * T, None, 1228 * G),
)


def spec_peak(device_kind: str) -> DevicePeak | None:
    kind = device_kind.lower()
    for key, bf16, f32, bandwidth in SPEC_TABLE:
        if key in kind:
            return DevicePeak(device_kind, bf16, bandwidth, "spec table", f32)
    return None


def cache_dir() -> Path:
    """`$JAXSTACK_XPROF_CACHE_DIR`, else `$XDG_CACHE_HOME/jaxstack/xprof-lite` (~/.cache/...)."""
    if env := os.environ.get("JAXSTACK_XPROF_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxstack" / "xprof-lite"


def _cache_key(device) -> str:
    raw = f"{device.platform}-{device.device_kind}-{os.cpu_count()}-{platform.node()}"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)


def _best_seconds(fn, *args, repeats: int) -> float:
    fn(*args).block_until_ready()  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def measure_peak(device=None, *, matmul_size: int = 1024, copy_mib: int = 64) -> DevicePeak:
    """Best-of-N f32 matmul FLOP/s and streaming read+write bytes/s on `device`."""
    device = device or jax.devices()[0]
    n = matmul_size
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    matmul = jax.jit(lambda x, y: x @ y)
    flops = 2.0 * n**3 / _best_seconds(matmul, a, a, repeats=5)
    x = jax.device_put(jnp.ones((copy_mib * 2**20 // 4,), jnp.float32), device)
    scale = jax.jit(lambda v: v * 1.0001)  # one read and one write per element, no reuse
    bandwidth = 2.0 * x.nbytes / _best_seconds(scale, x, repeats=5)
    return DevicePeak(device.device_kind, flops, bandwidth, "measured", flops)


def device_peak(device=None, *, refresh: bool = False) -> DevicePeak:
    """Peak FLOP/s and bytes/s of `device` (default: the first device).

    Known GPUs/TPUs come from the spec table; anything else (CPUs) is measured once by
    `measure_peak` and cached as JSON under `cache_dir()`; `refresh=True` measures again.
    """
    device = device or jax.devices()[0]
    if device.platform != "cpu" and (spec := spec_peak(device.device_kind)) is not None:
        return spec
    path = cache_dir() / f"peak-{_cache_key(device)}.json"
    if path.exists() and not refresh:
        try:
            return DevicePeak.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a damaged cache file is measured again and replaced
    peak = measure_peak(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(peak.to_dict(), indent=2))
        tmp.replace(path)
    except OSError as exc:
        raise Error(
            f"measured the device peak but could not cache it in {str(path)!r} ({exc}); "
            "set JAXSTACK_XPROF_CACHE_DIR to a writable directory"
        ) from exc
    return peak
