"""Device peaks, the denominator of rooflines and MFU: one spec table, or a measured CPU number.

Spec values are dense (no 2:4 sparsity) per-chip peaks from the vendors' data sheets: bf16 matrix
FLOP/s, the float32 matmul rate XLA actually uses at default precision (TF32 tensor cores on
NVIDIA Ampere and later, one bf16 pass on TPUs, so a float32 step can reach it), and memory
bandwidth. Each row names its source. A CPU has no useful data sheet number (cores, SIMD width,
clocks under load and the kernels XLA picks all matter), so it is measured: the best of many
repeats of a jitted matmul chain per dtype, cached as JSON in the user's cache directory. The
cache only ever keeps the highest value seen, since a busy machine can only measure low, and a
number measured while the machine was busy (1-minute load average above half a job per core) is
measured again on the next call until a quiet measurement replaces it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxstack.xprof_lite._src.errors import Error
from jaxstack.xprof_lite._src.files import write_text_atomically
from jaxstack.xprof_lite._src.machine import host_cpu


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """Peak compute and memory bandwidth of one device."""

    name: str
    flops_per_s: float  # bf16 matrix FLOP/s
    bytes_per_s: float
    source: str = "given"
    flops_per_s_f32: float | None = None  # float32 matmul FLOP/s where it differs
    load_per_core: float | None = None  # measured peaks: the load average per core meanwhile
    hbm_bytes: float | None = None  # device memory per chip, where the spec table gives it

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte above which an op is compute-bound."""
        return self.flops_per_s / self.bytes_per_s

    def flops_for(self, dtype: str | None) -> float:
        """The peak for a compute dtype ("float32"/"f32" or anything else: the bf16 rate)."""
        if dtype in ("f32", "float32") and self.flops_per_s_f32:
            return self.flops_per_s_f32
        return self.flops_per_s

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DevicePeak:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


@dataclasses.dataclass(frozen=True)
class SpecRow:
    """One data-sheet row: `match` is a lower-case substring of jax's `device_kind`."""

    match: str
    bf16_flops: float
    f32_flops: float | None  # None: the same as bf16 (TPUs run f32 matmuls as bf16 passes)
    bytes_per_s: float
    source: str
    hbm_bytes: float | None = None  # memory capacity per chip (TPU rows so far)


T, G = 1e12, 1e9
_NV = "NVIDIA data sheet, dense (the sheet's sparse figure halved)"
_GOOGLE = "Google Cloud TPU system architecture page, per chip"
SPEC_TABLE: tuple[SpecRow, ...] = (
    SpecRow("b200", 2250 * T, 1100 * T, 8000 * G, f"{_NV}: HGX B200, per GPU"),
    SpecRow("gh200", 989 * T, 494 * T, 4000 * G, f"{_NV}: GH200 Grace Hopper (96 GB HBM3)"),
    SpecRow("h200 nvl", 835 * T, 418 * T, 4800 * G, f"{_NV}: H200 NVL"),
    SpecRow("h200", 989 * T, 494 * T, 4800 * G, f"{_NV}: H200 SXM"),
    SpecRow("h100 nvl", 835 * T, 418 * T, 3900 * G, f"{_NV}: H100 NVL"),
    SpecRow("h100 pcie", 756 * T, 378 * T, 2000 * G, f"{_NV}: H100 PCIe"),
    SpecRow("h100", 989 * T, 494 * T, 3350 * G, f"{_NV}: H100 SXM"),
    SpecRow("h800", 989 * T, 494 * T, 3350 * G, f"{_NV}: H800 SXM (H100 SXM compute)"),
    SpecRow("a100-sxm4-40gb", 312 * T, 156 * T, 1555 * G, f"{_NV}: A100 40GB SXM"),
    SpecRow("a100-pcie-40gb", 312 * T, 156 * T, 1555 * G, f"{_NV}: A100 40GB PCIe"),
    SpecRow("a100 80gb pcie", 312 * T, 156 * T, 1935 * G, f"{_NV}: A100 80GB PCIe"),
    SpecRow("a100", 312 * T, 156 * T, 2039 * G, f"{_NV}: A100 80GB SXM"),
    SpecRow("l40s", 362 * T, 183 * T, 864 * G, f"{_NV}: L40S"),
    SpecRow("l4", 121 * T, 60 * T, 300 * G, f"{_NV}: L4"),
    # AWS publishes only 31.2 TFLOPS FP32 for the A10G (72 SMs at 1.71 GHz, like the A10); the
    # A10's per-SM tensor rate at that clock is an upper bound a step cannot exceed.
    SpecRow("a10g", 125 * T, 62.5 * T, 600 * G, f"{_NV}: A10 (A10G: AWS gives no tensor figure)"),
    SpecRow("a10", 125 * T, 62.5 * T, 600 * G, f"{_NV}: A10"),
    SpecRow("v100", 125 * T, 15.7 * T, 900 * G, f"{_NV}: V100 SXM2 (fp16 tensor; no TF32)"),
    SpecRow("tpu v6 lite", 918 * T, None, 1640 * G, f"{_GOOGLE}: v6e (Trillium)", 32 * G),
    SpecRow("tpu v6e", 918 * T, None, 1640 * G, f"{_GOOGLE}: v6e (Trillium)", 32 * G),
    SpecRow("tpu v5 lite", 197 * T, None, 819 * G, f"{_GOOGLE}: v5e", 16 * G),
    SpecRow("tpu v5e", 197 * T, None, 819 * G, f"{_GOOGLE}: v5e", 16 * G),
    SpecRow("tpu v5p", 459 * T, None, 2765 * G, f"{_GOOGLE}: v5p", 95 * G),
    SpecRow("tpu v5", 459 * T, None, 2765 * G, f"{_GOOGLE}: v5p", 95 * G),
    SpecRow("tpu v4", 275 * T, None, 1228 * G, f"{_GOOGLE}: v4", 32 * G),
    SpecRow("tpu v3", 123 * T, None, 900 * G, f"{_GOOGLE}: v3", 32 * G),
)
"""The project's one table of accelerator peaks (bf16 and float32 matmul FLOP/s, memory
bandwidth, HBM per chip where known, each row naming its data sheet): `spec_peak` matches a
device kind against it in order (more specific names first). MFU, rooflines and the TPU fit
checks all read it."""


def spec_peak(device_kind: str) -> DevicePeak | None:
    """The spec-table peak of a jax `device_kind` (e.g. "NVIDIA H100 PCIe"), or None."""
    kind = device_kind.lower()
    for row in SPEC_TABLE:
        if row.match in kind:
            source = f"spec table: {row.source}"
            return DevicePeak(
                device_kind,
                row.bf16_flops,
                row.bytes_per_s,
                source,
                row.f32_flops,
                hbm_bytes=row.hbm_bytes,
            )
    return None


def cache_dir() -> Path:
    """`$JAXSTACK_XPROF_CACHE_DIR`, else `$XDG_CACHE_HOME/jaxstack/xprof-lite` (~/.cache/...)."""
    if env := os.environ.get("JAXSTACK_XPROF_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxstack" / "xprof-lite"


def _cache_key(device) -> str:
    """CPU model, usable cores and jaxlib version: what decides the kernels and their speed."""
    cpu = host_cpu()
    raw = f"{device.platform}-{cpu.model}-{cpu.cores}cores-jax{jax.__version__}"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)


def _best_seconds(fn, *args, min_repeats: int, min_seconds: float) -> float:
    """The fastest of at least `min_repeats` calls spread over at least `min_seconds`."""
    fn(*args).block_until_ready()  # compile and warm up
    best, start, n = float("inf"), time.perf_counter(), 0
    while n < min_repeats or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        fn(*args).block_until_ready()
        best = min(best, time.perf_counter() - t)
        n += 1
    return best


def measure_matmul_flops(
    dtype: str = "float32",
    device=None,
    *,
    size: int = 1024,
    chain: int = 4,
    min_repeats: int = 10,
    min_seconds: float = 1.0,
) -> float:
    """Best FLOP/s of a jitted chain of `chain` square matmuls of `size` in `dtype`.

    The best of many repeats: other work on a shared machine only ever makes a repeat slower,
    so the fastest one is the closest to what the device can do.
    """
    device = device or jax.devices()[0]
    dt = jnp.dtype(dtype)
    a = jax.device_put(jnp.ones((size, size), dt) / size, device)
    b = jax.device_put(jnp.ones((size, size), dt), device)

    @jax.jit
    def matmuls(x, y):
        for _ in range(chain):
            x = (x @ y) * jnp.asarray(1.0 / size, dt)
        return x

    seconds = _best_seconds(matmuls, a, b, min_repeats=min_repeats, min_seconds=min_seconds)
    return 2.0 * size**3 * chain / seconds


def measure_bandwidth(device=None, *, copy_mib: int = 64) -> float:
    """Best streaming read+write bytes/s of an elementwise scale over `copy_mib` MiB."""
    device = device or jax.devices()[0]
    x = jax.device_put(jnp.ones((copy_mib * 2**20 // 4,), jnp.float32), device)
    scale = jax.jit(lambda v: v * 1.0001)  # one read and one write per element, no reuse
    return 2.0 * x.nbytes / _best_seconds(scale, x, min_repeats=5, min_seconds=0.2)


# Above this 1-minute load average per core a measured peak counts as taken on a busy machine.
BUSY_LOAD_PER_CORE = 0.5


def measure_peak(device=None) -> DevicePeak:
    """Measured bf16 and f32 matmul FLOP/s and streaming bytes/s of `device` (a few seconds)."""
    device = device or jax.devices()[0]
    f32 = measure_matmul_flops("float32", device)
    bf16 = measure_matmul_flops("bfloat16", device)
    name = host_cpu().model if device.platform == "cpu" else device.device_kind
    load = os.getloadavg()[0] / host_cpu().cores if hasattr(os, "getloadavg") else None
    return DevicePeak(name, bf16, measure_bandwidth(device), "measured", f32, load)


def _best_of(a: DevicePeak, b: DevicePeak) -> DevicePeak:
    f32 = max(a.flops_per_s_f32 or 0.0, b.flops_per_s_f32 or 0.0) or None
    quiet = min(a.load_per_core or 0.0, b.load_per_core or 0.0)
    return dataclasses.replace(
        b,
        load_per_core=quiet,
        flops_per_s=max(a.flops_per_s, b.flops_per_s),
        bytes_per_s=max(a.bytes_per_s, b.bytes_per_s),
        flops_per_s_f32=f32,
    )


def device_peak(device=None, *, refresh: bool = False) -> DevicePeak:
    """Peak FLOP/s and bytes/s of `device` (default: the first device).

    Known GPUs/TPUs come from the spec table; anything else (CPUs) is measured once by
    `measure_peak` and cached as JSON under `cache_dir()`. `refresh=True` measures again and
    keeps, per number, the higher of the new and the cached value; so does any call while the
    cached number was measured on a busy machine (`load_per_core` above `BUSY_LOAD_PER_CORE`).
    """
    device = device or jax.devices()[0]
    if device.platform != "cpu" and (spec := spec_peak(device.device_kind)) is not None:
        return spec
    path = cache_dir() / f"peak-{_cache_key(device)}.json"
    cached = None
    # None yet, or damaged: measured again and replaced.
    with contextlib.suppress(OSError, ValueError, TypeError):
        cached = DevicePeak.from_dict(json.loads(path.read_text()))
    busy = cached is not None and (cached.load_per_core or 0.0) > BUSY_LOAD_PER_CORE
    if cached is not None and not refresh and not busy:
        return cached
    peak = measure_peak(device)
    if cached is not None:
        peak = _best_of(cached, peak)
    try:
        write_text_atomically(path, json.dumps(peak.to_dict(), indent=2))
    except OSError as exc:
        raise Error(
            f"measured the device peak but could not cache it in {str(path)!r} ({exc}); "
            "set JAXSTACK_XPROF_CACHE_DIR to a writable directory"
        ) from exc
    return peak
