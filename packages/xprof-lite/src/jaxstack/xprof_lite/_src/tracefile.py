"""Reading a captured trace: find the XSpace file of a run, and pull HLO-op times out of it.

`jax.profiler.trace(logdir)` writes `logdir/plugins/profile/<timestamp>/<host>.xplane.pb` (the
layout XProf and TensorBoard read). `jax.profiler.ProfileData` parses it in-process; events that
execute an HLO instruction carry `hlo_op` and `hlo_module` stats (on CPU on the host plane's XLA
threads, on GPU/TPU on `/device:*` planes).
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

from jax.profiler import ProfileData

from jaxstack.xprof_lite._src.errors import Error


def run_dirs(logdir: str | os.PathLike) -> list[Path]:
    """The capture runs under `logdir`, oldest first (their names are timestamps)."""
    root = Path(logdir) / "plugins" / "profile"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.xplane.pb")))


def find_xplane(path: str | os.PathLike) -> Path:
    """The `.xplane.pb` for a file, a run directory or a logdir (its newest run)."""
    path = Path(path)
    if path.is_file():
        return path
    candidates = sorted(path.glob("*.xplane.pb"))
    if not candidates and run_dirs(path):
        candidates = sorted(run_dirs(path)[-1].glob("*.xplane.pb"))
    if not candidates:
        raise Error(
            f"no *.xplane.pb under {str(path)!r}; pass the logdir given to "
            "xprof_lite.trace(logdir) (or a plugins/profile/<run> directory)"
        )
    return candidates[0]


def load_trace(source: ProfileData | str | os.PathLike) -> ProfileData:
    """A `ProfileData` from itself, an xplane file, a run directory or a logdir.

    An empty, truncated or corrupt file is an `Error` naming it, not a parser traceback: a
    capture that was killed or ran out of disk leaves such files behind.
    """
    if isinstance(source, ProfileData):
        return source
    path = find_xplane(source)
    if path.stat().st_size == 0:
        raise Error(f"{str(path)!r} is empty (0 bytes): the capture did not finish; capture again")
    try:
        return ProfileData.from_file(str(path))
    except RuntimeError as e:  # what the XSpace parser raises for bytes it cannot read
        raise Error(
            f"{str(path)!r} is not a readable XSpace profile (truncated or corrupt: {e}); "
            "capture again"
        ) from e


@dataclasses.dataclass(frozen=True)
class Event:
    plane: str
    line: str
    name: str
    start_ns: float
    end_ns: float
    stats: dict

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


def events(data: ProfileData) -> list[Event]:
    """Every event of every plane and line."""
    with warnings.catch_warnings():
        # jaxlib's stats iterator warns about its own missing __module__ (harmless).
        warnings.simplefilter("ignore", DeprecationWarning)
        return list(_events(data))


def _events(data: ProfileData) -> Iterator[Event]:
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                yield Event(
                    plane.name,
                    line.name,
                    e.name,
                    e.start_ns,
                    e.start_ns + e.duration_ns,
                    dict(e.stats),
                )


@dataclasses.dataclass
class OpTime:
    """Measured self time of one HLO instruction over a whole trace."""

    total_ns: float = 0.0
    occurrences: int = 0


_ANNOTATED_OP = re.compile(r"hlo_op=([^,#}\s]+)")
_ANNOTATED_MODULE = re.compile(r"hlo_module=([^,#}\s]+)")
# Lines that XProf derives from other lines of a device plane; reading them too double counts.
_DERIVED_LINES = frozenset(
    {"XLA Modules", "Steps", "XLA TraceMe", "Framework Ops", "Framework Name Scope",
     "TensorFlow Ops", "TensorFlow Name Scope", "Source code", "Launch Stats", "SparseCore"}
)  # fmt: skip


def hlo_identity(event: Event) -> tuple[str, str] | None:
    """(hlo_module, hlo_op) of an event that executes an HLO instruction, else None.

    CPU thunks and processed device planes carry `hlo_op`/`hlo_module` stats; raw GPU kernel
    events carry them inside an annotation string (`...#hlo_op=fusion.3,hlo_module=jit_f#`).
    """
    if "hlo_op" in event.stats:
        return str(event.stats.get("hlo_module", "")), str(event.stats["hlo_op"])
    for text in (event.name, *(v for v in event.stats.values() if isinstance(v, str))):
        if "hlo_op=" in text:
            module = _ANNOTATED_MODULE.search(text)
            return (module.group(1) if module else ""), _ANNOTATED_OP.search(text).group(1)
    return None


def hlo_op_times(data: ProfileData) -> dict[tuple[str, str], OpTime]:
    """Self time per (hlo_module, hlo_op), summed over every execution in the trace.

    Self time: an op's event minus the HLO-op events nested inside it on the same line (a while
    loop's event spans its body's ops, which are counted themselves). Device planes win over the
    host plane when both carry HLO ops, so host-side launch records are not double counted; on a
    device plane with an "XLA Ops" line only that line is read.
    """
    by_line: dict[tuple[str, str], list[tuple[Event, tuple[str, str]]]] = {}
    for event in events(data):
        identity = hlo_identity(event)
        if identity is not None and event.line not in _DERIVED_LINES:
            by_line.setdefault((event.plane, event.line), []).append((event, identity))
    if any(plane.startswith("/device:") for plane, _ in by_line):
        by_line = {k: v for k, v in by_line.items() if k[0].startswith("/device:")}
    with_ops_line = {plane for plane, line in by_line if line == "XLA Ops"}
    by_line = {k: v for k, v in by_line.items() if k[0] not in with_ops_line or k[1] == "XLA Ops"}
    times: dict[tuple[str, str], OpTime] = {}
    for line_events in by_line.values():
        line_events.sort(key=lambda pair: (pair[0].start_ns, -pair[0].end_ns))
        self_ns = [e.duration_ns for e, _ in line_events]
        stack: list[int] = []
        for i, (event, _) in enumerate(line_events):
            while stack and line_events[stack[-1]][0].end_ns <= event.start_ns:
                stack.pop()
            if stack:
                self_ns[stack[-1]] -= event.duration_ns
            stack.append(i)
        for (_, key), ns in zip(line_events, self_ns, strict=True):
            entry = times.setdefault(key, OpTime())
            entry.total_ns += max(ns, 0.0)
            entry.occurrences += 1
    return times


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def covered_ns(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of `intervals` clipped to [lo, hi]."""
    clipped = [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]
    return sum(e - s for s, e in merge_intervals(clipped))
