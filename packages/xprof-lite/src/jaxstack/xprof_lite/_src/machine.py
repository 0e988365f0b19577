"""What host this is (CPU model, vector units) and the host-allocator setting that suits it.

XLA:CPU allocates an executable's temporary buffer (about 420 MB for a d256 training step) with
malloc from its worker threads. glibc serves a request that large with a fresh `mmap` and
`munmap`s it on free, so every step faults the whole buffer back in and the kernel zeroes each
page again. `set_host_allocator("retain")` sets glibc to one arena, no mmap and a 2 GiB trim
threshold, so freed blocks stay in the heap and the next step reuses them. Whether that pays
depends on the machine, measured in benchmarks/train (interleaved A/B runs of jaxstack-train):

- Intel Xeon with AVX-512/AMX: retain 1.2x faster at d256 (108k fewer page faults per step);
  PyTorch's trainer gained 4-8% and MaxText 5-11% from the same glibc settings there.
- AMD EPYC with AVX2/FMA and no AVX-512: one such machine measured retain 1.2-1.3x *slower*
  (issue #20), another with the same CPU flags 1.1x *faster*.

So CPU flags alone cannot decide it. `"auto"` here applies the flags' best guess (retain only
with AVX-512); a loop that runs many steps of one shape measures instead, with
`HostAllocatorTrial`. The settings are process-wide and only affect allocations made after them,
so apply them before JAX starts its backend. They are no-ops on anything but glibc (macOS, musl).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import pathlib
import platform
import statistics
from collections.abc import Callable, Sequence

from jaxstack.xprof_lite._src.errors import Error

# x86 flags that change which matmul kernels XLA and oneDNN pick.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
HOST_ALLOCATORS = ("auto", "retain", "system")
"""The modes of `set_host_allocator`: "auto" (the CPU flags' guess), "retain" (keep freed
host memory mapped) and "system" (malloc as it is)."""

# mallopt(3) parameter numbers from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# Freed memory above this at the top of the heap still goes back to the OS.
TRIM_THRESHOLD_BYTES = 2**31 - 1
RETAIN_SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
# glibc's defaults in the state its dynamic threshold rule settles in on 64-bit hosts once the
# program has freed large mmapped blocks: blocks from 32 MiB up are mmapped, and the heap top
# is trimmed above twice that (malloc.c's DEFAULT_MMAP_THRESHOLD_MAX, DEFAULT_MMAP_MAX).
SYSTEM_SETTINGS = ((M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 64 << 20))
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
    """Applies `"retain"`, `"system"` or the CPU flags' guess (`"auto"`); returns what applies.

    `"system"` leaves malloc as it is. `"retain"` returns `"system"` where the C library is not
    glibc or refuses the settings.
    """
    if mode not in HOST_ALLOCATORS:
        raise Error(f"host allocator {mode!r} is not one of {', '.join(HOST_ALLOCATORS)}")
    if mode == "auto":
        mode = choose_host_allocator()
    if mode == "system":
        return "system"
    return "retain" if _mallopt(((M_ARENA_MAX, 1), *RETAIN_SETTINGS)) else "system"


class SettingTrial:
    """Chooses one of several settings by timing a loop's first steps under each.

    Used as `before_step()` (returns the setting the next step runs under), the step,
    `after_step(seconds)` until `done`. The trial runs `rounds` rounds; each gives every setting
    a block of one settling step (the first step after a switch pays for it: a heap that grows,
    caches that refill) and `steps_per_block` timed steps, in an order that reverses between
    rounds so a machine that speeds up or slows down during the trial favours none. The setting
    with the lowest median step time wins. `apply(setting)`, if given, is called before each
    step's setting and once more with the winner, which stays applied. `name` labels the log
    line (`describe`).

    A setting can be ruinous rather than slower (oneDNN's bf16 matmuls on a CPU without bf16
    instructions ran a train step 200x slower). With `give_up`, one whose step takes over
    `give_up` times another setting's median so far is dropped at once: the trial loses that one
    step, not its whole plan. Keep it well above the slowdowns a busy machine causes by itself,
    which the medians are there to absorb.
    """

    def __init__(
        self,
        settings: Sequence[str],
        apply: Callable[[str], None] | None = None,
        rounds: int = 2,
        steps_per_block: int = 2,
        name: str = "setting",
        give_up: float | None = None,
    ) -> None:
        if len(settings) < 2 or len(set(settings)) != len(settings):
            raise Error(f"a trial needs two or more distinct settings, got {list(settings)}")
        self.settings = tuple(settings)
        self.name = name
        self.give_up = give_up
        self.dropped: dict[str, float] = {}  # setting -> the step time that dropped it
        self.step_times: dict[str, list[float]] = {s: [] for s in self.settings}
        self.choice: str | None = None
        self._apply = apply or (lambda setting: None)
        self._plan: list[tuple[str, bool]] = []  # (setting, timed) per trial step
        self._taken = 0
        for r in range(rounds):
            for setting in self.settings if r % 2 == 0 else self.settings[::-1]:
                self._plan += [(setting, False)] + [(setting, True)] * steps_per_block

    @property
    def steps(self) -> int:
        """How many steps the whole trial takes."""
        return len(self._plan)

    @property
    def done(self) -> bool:
        return self.choice is not None

    def before_step(self) -> str:
        """Applies the setting the next step runs under and returns it."""
        setting = self.choice if self.done else self._plan[self._taken][0]
        if not self.done:
            self._apply(setting)
        return setting

    def after_step(self, seconds: float) -> None:
        """Records the step just run; after the trial's last step, applies the fastest setting."""
        if self.done:
            return
        setting, timed = self._plan[self._taken]
        if timed:
            self.step_times[setting].append(seconds)
        others = [
            statistics.median(t)
            for s, t in self.step_times.items()
            if t and s != setting and s not in self.dropped
        ]
        if self.give_up and others and seconds > self.give_up * min(others):
            self.dropped[setting] = seconds
            rest = self._plan[self._taken + 1 :]
            self._plan[self._taken + 1 :] = [entry for entry in rest if entry[0] != setting]
        if self._taken + 1 == len(self._plan):
            kept = [s for s in self.settings if self.step_times[s] and s not in self.dropped]
            self.choice = min(kept, key=lambda s: statistics.median(self.step_times[s]))
            self._apply(self.choice)
        self._taken += 1

    def describe(self) -> str:
        """One line for a run's log: the choice and the median step times behind it."""
        medians = ", ".join(
            f"{s} {statistics.median(t):.3f}s"
            for s, t in self.step_times.items()
            if t and s not in self.dropped
        )
        dropped = "".join(f"; {s} dropped after a {t:.1f}s step" for s, t in self.dropped.items())
        return f"{self.name}: {self.choice} (median step: {medians or 'not measured'}{dropped})"


class HostAllocatorTrial(SettingTrial):
    """Chooses `"retain"` or `"system"` by timing a loop's first steps under each, then keeps it.

    A `SettingTrial` whose settings are the allocator's. glibc never moves a thread to another
    arena, and only the main one can hold a block as large as XLA's step buffer, so the trial
    sets one arena when it is created (before JAX starts its threads) and then switches only
    whether large blocks are mmapped afresh (`SYSTEM_SETTINGS`) or kept in the heap
    (`RETAIN_SETTINGS`). Where mallopt is unavailable the trial is empty and `choice` is
    `"system"`.
    """

    MODES = ("system", "retain")

    def __init__(self, rounds: int = 2, steps_per_block: int = 2) -> None:
        super().__init__(self.MODES, _apply, rounds, steps_per_block, name="host allocator")
        if not _mallopt(((M_ARENA_MAX, 1),)):
            self.choice = "system"
            self._plan = []


def _apply(mode: str) -> None:
    _mallopt(RETAIN_SETTINGS if mode == "retain" else SYSTEM_SETTINGS)


def _mallopt(settings: tuple[tuple[int, int], ...]) -> bool:
    """Applies glibc mallopt settings; False off glibc or when glibc refuses one."""
    if not ON_GLIBC:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(p, v) == 1 for p, v in settings)
