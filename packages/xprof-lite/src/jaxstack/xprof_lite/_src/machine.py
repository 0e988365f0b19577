"""What host this is (CPU model, vector units) and the host-allocator setting that suits it.

XLA:CPU allocates an executable's temporary buffer (about 420 MB for a d256 training step) with
malloc from its worker threads. glibc serves a request that large with a fresh `mmap` and
`munmap`s it on free, so every step faults the whole buffer back in and the kernel zeroes each
page again. `set_host_allocator("retain")` sets glibc to one arena, no mmap and a 2 GiB trim
threshold, so freed blocks stay in the heap and the next step reuses them. Whether that pays
depends on the machine, measured in benchmarks/train (interleaved A/B runs of jaxstack-train):

- Intel Xeon with AVX-512/AMX: retain 1.2x faster at d256 (108k fewer page faults per step);
  PyTorch's trainer gained 4-8% and MaxText 5-11% from the same glibc settings there.
- AMD EPYC with AVX2/FMA and no AVX-512: retain 1.2-1.3x *slower* (issue #20's runs and
  benchmarks/train/results-allocator-amd-epyc-avx2.md).

So `"auto"` retains host memory only on CPUs with AVX-512. The setting is process-wide and only
affects allocations made after it, so call it before JAX starts its backend. It is a no-op on
anything but glibc (macOS, musl).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import pathlib
import platform

from jaxstack.xprof_lite._src.errors import Error

# x86 flags that change which matmul kernels XLA and oneDNN pick.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
HOST_ALLOCATORS = ("auto", "retain", "system")

# mallopt(3) parameter numbers from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# Freed memory above this at the top of the heap still goes back to the OS.
TRIM_THRESHOLD_BYTES = 2**31 - 1
ON_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@dataclasses.dataclass(frozen=True)
class HostCPU:
    """The host CPU as the kernels see it: model name, vector flags, usable cores."""

    model: str
    flags: tuple[str, ...]
    cores: int

    @property
    def has_avx512(self) -> bool:
        return "avx512f" in self.flags


@functools.cache
def host_cpu() -> HostCPU:
    """The CPU model and the `VECTOR_FLAGS` it has (from /proc/cpuinfo on Linux)."""
    model, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return HostCPU(model, tuple(f for f in VECTOR_FLAGS if f in flags), cores or 1)


def choose_host_allocator(cpu: HostCPU | None = None) -> str:
    """`"retain"` on CPUs with AVX-512, else `"system"` (the measured rule; see module doc)."""
    cpu = cpu or host_cpu()
    return "retain" if ON_GLIBC and cpu.has_avx512 else "system"


def set_host_allocator(mode: str = "auto") -> str:
    """Applies `"retain"`, `"system"` or the machine's choice (`"auto"`); returns what applies.

    `"system"` leaves malloc as it is. `"retain"` returns `"system"` where the C library is not
    glibc or refuses the settings.
    """
    if mode not in HOST_ALLOCATORS:
        raise Error(f"host allocator {mode!r} is not one of {', '.join(HOST_ALLOCATORS)}")
    if mode == "auto":
        mode = choose_host_allocator()
    if mode == "system" or not ON_GLIBC:
        return "system"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "system"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return "retain" if all(mallopt(p, v) == 1 for p, v in settings) else "system"
