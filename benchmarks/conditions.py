"""Run conditions of a benchmark, measured by the script rather than typed by hand.

Every benchmark in this folder wraps its timed part in `measure_conditions()`: the load average
is sampled before, every few seconds during, and after the run, and the machine (CPU model,
the vector-instruction flags that decide which kernels run, cores: xprof-lite's `host_cpu`,
the same reading the trainer's allocator choice uses) and the versions of the
libraries involved are read from the system. The CPU time the benchmark itself used (its
threads and its finished child processes) is measured too, since the load average counts it:
a benchmark keeping both cores busy on an idle machine shows a load of about 2, and only the
load beyond its own is other work. Where the kernel tells (Linux `/proc/stat`), the CPU time all
processes used is read as well, for a second before the run and over it: the machine's busy
cores minus the benchmark's own are the cores other work kept busy, without the load average's
one-minute memory (in a `run_all.py` sitting that memory holds the previous benchmark). The
result goes into the results JSON as-is and into the Markdown table's header through
`conditions_markdown`, so a reader can tell a quiet run from one on a shared machine.

    import sys, pathlib; sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    from conditions import measure_conditions, conditions_markdown

    with measure_conditions(packages=["jax", "jaxstack-serving"]) as conditions:
        rows = run_benchmark()
    meta = conditions.as_dict()
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import statistics
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jaxstack.xprof_lite import host_cpu

WORKSPACE_PACKAGES = Path(__file__).resolve().parents[1] / "packages"


def workspace_version(name: str) -> str | None:
    """The version in the workspace's pyproject.toml of a `jaxstack-*` distribution, if any."""
    folder = name.removeprefix("jaxstack-")
    pyproject = WORKSPACE_PACKAGES / folder / "pyproject.toml"
    if not name.startswith("jaxstack-") or not pyproject.is_file():
        return None
    return tomllib.loads(pyproject.read_text())["project"]["version"]


def package_versions(names: list[str]) -> dict[str, str]:
    """Installed versions of the named distributions ("absent" where not installed). A
    workspace package runs from its source (an editable install), whose version can be newer
    than the installed metadata until the venv is synced: the source's version is recorded
    then, with the stale one beside it."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
        source = workspace_version(name)
        if source is not None and source != versions[name]:
            versions[name] = f"{source} (source; installed metadata says {versions[name]})"
    return versions


@dataclass
class RunConditions:
    started_utc: str
    cpu_model: str
    cpu_flags: list[str]
    cpu_cores: int
    python: str
    versions: dict[str, str]
    load_before: float
    load_during: list[float] = field(default_factory=list)
    load_after: float | None = None
    wall_s: float | None = None
    own_cpu_s: float | None = None
    other_cores_before: float | None = None
    machine_cpu_s: float | None = None

    def as_dict(self) -> dict:
        during = self.load_during or [self.load_before]
        return {
            "started_utc": self.started_utc,
            "cpu_model": self.cpu_model,
            "cpu_flags": self.cpu_flags,
            "cpu_cores": self.cpu_cores,
            "python": self.python,
            "versions": self.versions,
            "load_average_1min": {
                "before": self.load_before,
                "during_median": statistics.median(during),
                "during_max": max(during),
                "after": self.load_after,
            },
            "wall_s": self.wall_s,
            # Cores the benchmark kept busy on average (its own share of the load during).
            "own_cpu_cores": self.own_cpu_s / self.wall_s
            if self.own_cpu_s and self.wall_s
            else None,
            # Cores other processes kept busy, in the second before and during the run.
            "other_cpu_cores": {
                "before": self.other_cores_before,
                "during": max(0.0, (self.machine_cpu_s - (self.own_cpu_s or 0.0)) / self.wall_s),
            }
            if self.machine_cpu_s is not None and self.wall_s
            else None,
        }


@contextlib.contextmanager
def measure_conditions(
    packages: list[str] | tuple[str, ...] = ("jax", "jaxlib"),
    sample_every_s: float = 5.0,
    before_s: float = 1.0,
) -> Iterator[RunConditions]:
    """Record the machine and sample the 1-minute load average around the `with` body, and
    the CPU time other processes use in the `before_s` seconds before it and during it."""
    cpu = host_cpu()
    busy_start, wait_start = _machine_cpu_seconds(), time.perf_counter()
    time.sleep(before_s)
    busy_end = _machine_cpu_seconds()
    other_before = (
        (busy_end - busy_start) / (time.perf_counter() - wait_start)
        if busy_start is not None and busy_end is not None
        else None
    )
    conditions = RunConditions(
        started_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        cpu_model=cpu.model,
        cpu_flags=list(cpu.flags),
        cpu_cores=cpu.cores,
        python=platform.python_version(),
        versions=package_versions(list(packages)),
        load_before=os.getloadavg()[0],
        other_cores_before=other_before,
    )
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(sample_every_s):
            conditions.load_during.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    start, cpu_start, machine_start = time.perf_counter(), _cpu_seconds(), _machine_cpu_seconds()
    sampler.start()
    try:
        yield conditions
    finally:
        stop.set()
        sampler.join()
        conditions.wall_s = time.perf_counter() - start
        conditions.own_cpu_s = _cpu_seconds() - cpu_start
        machine_end = _machine_cpu_seconds()
        if machine_start is not None and machine_end is not None:
            conditions.machine_cpu_s = machine_end - machine_start
        conditions.load_after = os.getloadavg()[0]


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of its children that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _machine_cpu_seconds() -> float | None:
    """CPU seconds every process on the machine has used (Linux `/proc/stat`: user, nice,
    system, irq, softirq, steal), or None where there is no such file."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine_kind(cpu_model: str, cpu_flags: list[str]) -> str:
    """A short file-name tag for the CPU kind: vendor, family, widest vector unit and the
    matrix/bf16 extensions that change which dtype is fastest (AMX tiles, AVX512-BF16)."""
    words = cpu_model.lower().replace("(r)", "").replace("(tm)", "").split()
    vendor = "-".join(w for w in words[:2] if w.isalpha()) or "cpu"
    vector = "avx512" if "avx512f" in cpu_flags else "avx2" if "avx2" in cpu_flags else "novec"
    if "amx_tile" in cpu_flags:
        vector += "-amx"
    elif "avx512_bf16" in cpu_flags:
        vector += "-bf16"
    return f"{vendor}-{vector}"


def was_busy(conditions: dict) -> bool:
    """Whether other work kept more than half the cores busy, the benchmark's own work left out.

    Measured CPU time of other processes (before and during the run) decides where recorded.
    Otherwise the load average during the run less the benchmark's own cores; the load before
    the run is not used then, since in a sitting of benchmarks it is mostly the previous
    benchmark's (the load average forgets over minutes). Results older than the own-CPU
    measure have only the load, and are busy when it was."""
    half = 0.5 * conditions["cpu_cores"]
    other = conditions.get("other_cpu_cores")
    if other:
        return max(other["before"] or 0.0, other["during"]) > half
    load = conditions["load_average_1min"]
    own = conditions.get("own_cpu_cores")
    if own is None:
        return max(load["during_max"], load["before"]) > half
    return load["during_median"] - own > half


def conditions_markdown(conditions: dict) -> str:
    """The run conditions as a short Markdown paragraph for the top of a results file."""
    load = conditions["load_average_1min"]
    cores = conditions["cpu_cores"]
    own = conditions.get("own_cpu_cores")
    other = conditions.get("other_cpu_cores")
    verdict = "a shared, busy machine" if was_busy(conditions) else "a quiet machine"
    versions = ", ".join(f"{k} {v}" for k, v in conditions["versions"].items())
    flags = " ".join(conditions["cpu_flags"]) or "no AVX2/AVX-512/AMX"
    after = load["after"]
    return (
        f"Run {conditions['started_utc']} UTC on {conditions['cpu_model']} ({cores} cores; "
        f"vector flags: {flags}), Python {conditions['python']}; {versions}. "
        f"1-minute load average: {load['before']:.2f} before, median {load['during_median']:.2f}"
        f" (max {load['during_max']:.2f}) during, "
        f"{after if after is None else format(after, '.2f')} after"
        + (f"; the benchmark itself kept {own:.2f} cores busy on average" if own else "")
        + (
            f", other processes {other['during']:.2f} (and {other['before'] or 0:.2f} in the "
            "second before)"
            if other
            else ""
        )
        + f": {verdict}. "
        f"Wall time {conditions['wall_s'] or 0:.0f} s."
    )
