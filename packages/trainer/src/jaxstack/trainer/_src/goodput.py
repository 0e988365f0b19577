"""Goodput: the share of wall time spent in productive training steps.

Every second of a run falls into one bucket: `step` (productive), or a kind of lost time —
`startup` (imports, config, model init, mesh), `compile`, `data_wait` (blocked on the input
pipeline), `checkpoint`, `eval`, and `other` (logging, whatever is left). The tracker measures
the named buckets with a context manager and attributes the rest of the wall time to `other`,
so the breakdown always sums to the wall time and goodput is a fraction. Buckets never overlap:
measuring one inside another, or adding more seconds than the wall clock has left unattributed,
is refused rather than counted twice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

LOST = ("startup", "compile", "data_wait", "checkpoint", "eval")


class GoodputTracker:
    """Accumulates seconds per bucket from the moment it is created (or from `start`)."""

    def __init__(self, start: float | None = None) -> None:
        now = time.perf_counter()
        if start is not None and start > now:
            raise ValueError(
                f"goodput start {start} is in the future of time.perf_counter() ({now}); pass a "
                "time.perf_counter() value taken earlier in this process"
            )
        self.start = now if start is None else start
        self.seconds: dict[str, float] = {"step": 0.0, **{k: 0.0 for k in LOST}}
        self._measuring: str | None = None

    @contextlib.contextmanager
    def measure(self, bucket: str) -> Iterator[None]:
        if self._measuring is not None:
            raise RuntimeError(
                f"goodput bucket {bucket!r} measured inside {self._measuring!r}; the time would "
                "count twice"
            )
        self._measuring = bucket
        t = time.perf_counter()
        try:
            yield
        finally:
            self._measuring = None
            self.add(bucket, time.perf_counter() - t)

    def add(self, bucket: str, seconds: float) -> None:
        """Attributes `seconds` of the wall time so far to `bucket`."""
        if bucket not in self.seconds:
            raise KeyError(f"unknown goodput bucket {bucket!r}; use step or one of {LOST}")
        unattributed = self.wall() - sum(self.seconds.values())
        if not 0 <= seconds <= unattributed + 1e-6:
            raise ValueError(
                f"cannot add {seconds:.6f}s to goodput bucket {bucket!r}: only "
                f"{unattributed:.6f}s of wall time are not attributed yet"
            )
        self.seconds[bucket] += seconds

    def wall(self) -> float:
        return time.perf_counter() - self.start

    def summary(self) -> dict[str, float]:
        """`goodput` (0-1), `wall_s`, `step_s` and `lost_<bucket>_s` for every lost bucket."""
        named = sum(self.seconds.values())
        wall = max(self.wall(), named, 1e-9)
        out = {"goodput": self.seconds["step"] / wall, "wall_s": wall}
        out["step_s"] = self.seconds["step"]
        for bucket in LOST:
            out[f"lost_{bucket}_s"] = self.seconds[bucket]
        out["lost_other_s"] = wall - named
        return out
