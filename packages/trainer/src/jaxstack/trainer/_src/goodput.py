"""Goodput: the share of wall time spent in productive training steps.

Every second of a run falls into one bucket: `step` (productive), or a kind of lost time —
`startup` (imports, config, model init, mesh), `compile`, `data_wait` (blocked on the input
pipeline), `checkpoint`, `eval`, and `other` (logging, whatever is left). The tracker measures
the named buckets with a context manager and attributes the rest of the wall time to `other`,
so the breakdown always sums to the wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

LOST = ("startup", "compile", "data_wait", "checkpoint", "eval")


class GoodputTracker:
    """Accumulates seconds per bucket from the moment it is created (or from `start`)."""

    def __init__(self, start: float | None = None) -> None:
        self.start = time.perf_counter() if start is None else start
        self.seconds: dict[str, float] = {"step": 0.0, **{k: 0.0 for k in LOST}}

    @contextlib.contextmanager
    def measure(self, bucket: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(bucket, time.perf_counter() - t)

    def add(self, bucket: str, seconds: float) -> None:
        if bucket not in self.seconds:
            raise KeyError(f"unknown goodput bucket {bucket!r}; use step or one of {LOST}")
        self.seconds[bucket] += seconds

    def wall(self) -> float:
        return time.perf_counter() - self.start

    def summary(self) -> dict[str, float]:
        """`goodput` (0-1), `wall_s`, `step_s` and `lost_<bucket>_s` for every lost bucket."""
        wall = max(self.wall(), 1e-9)
        named = sum(self.seconds.values())
        out = {"goodput": self.seconds["step"] / wall, "wall_s": wall}
        out["step_s"] = self.seconds["step"]
        for bucket in LOST:
            out[f"lost_{bucket}_s"] = self.seconds[bucket]
        out["lost_other_s"] = max(0.0, wall - named)
        return out
