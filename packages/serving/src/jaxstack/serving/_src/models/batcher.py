"""Dynamic batching: merge queued requests into a few padded batch sizes, then split back.

One worker thread per model version owns the model. It waits for the first request, keeps
collecting until `max_batch_size` rows are queued or the oldest request has waited
`max_queue_delay_s`, concatenates the requests along axis 0, pads the rows up to the smallest
compiled batch size that fits (so XLA never recompiles on the request path), runs the model once
and hands every request its own slice of each output. The queue is bounded: a full one refuses
new work at once (`ServerBusyError`) rather than growing without limit.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from jaxstack.serving._src.errors import ArtifactError, InvalidInputError, ServerBusyError

logger = logging.getLogger(__name__)

RunFn = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]


def default_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to `max_batch_size`, plus `max_batch_size` itself."""
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return (*sizes, max_batch_size)


@dataclass
class BatchStats:
    """What one executed batch looked like, for metrics."""

    rows: int
    padded_rows: int
    requests: int
    queue_seconds: list[float]
    compute_seconds: float


@dataclass
class _Request:
    inputs: dict[str, np.ndarray]
    rows: int
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)


class DynamicBatcher:
    """A bounded request queue in front of `run_fn`, executed in merged, padded batches.

    Args:
      run_fn: runs one batch, `{input: array[B, ...]}` -> `{output: array[B, ...]}`; called only
        with B in `batch_sizes`.
      max_batch_size: most rows merged into one call.
      max_queue_delay_s: longest the oldest queued request waits for company.
      max_queue_size: most requests waiting; beyond it `submit` raises `ServerBusyError`.
      batch_sizes: the compiled sizes rows are padded to (default powers of two).
      on_batch: called after each batch with its `BatchStats` (metrics).
      trim_padding: when padding up to the next compiled size would waste more rows than
        running the next smaller size leaves queued, run the smaller size.
    """

    def __init__(
        self,
        run_fn: RunFn,
        *,
        max_batch_size: int = 32,
        max_queue_delay_s: float = 0.002,
        max_queue_size: int = 256,
        batch_sizes: Sequence[int] | None = None,
        on_batch: Callable[[BatchStats], None] | None = None,
        trim_padding: bool = True,
        name: str = "batcher",
    ):
        sizes = tuple(sorted(set(batch_sizes or default_batch_sizes(max_batch_size))))
        if max_batch_size < 1 or max_queue_size < 1 or max_queue_delay_s < 0:
            raise ValueError("max_batch_size, max_queue_size >= 1 and max_queue_delay_s >= 0")
        if sizes[0] < 1 or sizes[-1] < max_batch_size:
            raise ValueError(f"batch_sizes {sizes} must be >= 1 and reach {max_batch_size}")
        self.run_fn = run_fn
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_size = max_queue_size
        self.batch_sizes = sizes
        self.on_batch = on_batch
        self.trim_padding = trim_padding
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name=name, daemon=True)
        self._worker.start()

    @property
    def queue_size(self) -> int:
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, inputs: dict[str, np.ndarray]) -> Future:
        """Queue one request (all inputs share the leading size); its Future gets the outputs."""
        rows = {int(v.shape[0]) for v in inputs.values()}
        if len(rows) != 1:
            raise InvalidInputError(f"inputs have different batch sizes {sorted(rows)}")
        (n,) = rows
        if not 1 <= n <= self.max_batch_size:
            raise InvalidInputError(
                f"a request carries {n} rows; this model accepts 1 to {self.max_batch_size} "
                "rows per request (split larger batches)"
            )
        request = _Request(inputs, n)
        with self._cond:
            if self._closed:
                raise ServerBusyError("this model version is draining and takes no new requests")
            if len(self._queue) >= self.max_queue_size:
                raise ServerBusyError(
                    f"the queue is full ({self.max_queue_size} requests waiting); retry later"
                )
            self._queue.append(request)
            self._queued_rows += n
            self._cond.notify()
        return request.future

    def close(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Refuse new requests, finish every queued one (drain), then stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if wait:
            self._worker.join(timeout)

    def _next_batch(self) -> list[_Request] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].enqueued + self.max_queue_delay_s
            while self._queued_rows < self.max_batch_size and not self._closed:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            limit = self._rows_to_take(self._queued_rows)
            batch, rows = [], 0
            while self._queue and rows + self._queue[0].rows <= limit:
                request = self._queue.popleft()
                rows += request.rows
                batch.append(request)
            if not batch:  # a request larger than the trimmed size: pad it instead
                batch, rows = [self._queue.popleft()], 0
                rows = batch[0].rows
            self._queued_rows -= rows
            return batch

    def _rows_to_take(self, queued: int) -> int:
        """Rows for the next batch: all that fit, or fewer when padding would waste more.

        With `trim_padding`, 40 queued rows and sizes (32, 64) run as 32 now (8 stay first in
        line for the next batch) instead of 64 with 24 rows of padding: under load, padding is
        compute thrown away, while the remainder only waits for one batch.
        """
        rows = min(queued, self.max_batch_size)
        if not self.trim_padding:
            return self.max_batch_size
        i = bisect.bisect_left(self.batch_sizes, rows)
        up = self.batch_sizes[i]
        down = self.batch_sizes[i - 1] if i > 0 else up
        return down if up - rows > rows - down else self.max_batch_size

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        start = time.perf_counter()
        # A cancelled Future (its client went away) needs no answer, and no rows.
        batch = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not batch:
            return
        rows = sum(r.rows for r in batch)
        padded = self.batch_sizes[bisect.bisect_left(self.batch_sizes, rows)]
        try:
            merged = {
                name: _pad(np.concatenate([r.inputs[name] for r in batch]), padded)
                for name in batch[0].inputs
            }
            outputs = _check_batch_outputs(self.run_fn(merged), padded)
            answers = []
            offset = 0
            for r in batch:
                answers.append({k: v[offset : offset + r.rows] for k, v in outputs.items()})
                offset += r.rows
        except Exception as e:
            # Whatever went wrong, only this batch fails: the worker lives on for the queue.
            for r in batch:
                r.future.set_exception(e)
            return
        done = time.perf_counter()
        for r, answer in zip(batch, answers, strict=True):
            r.future.set_result(answer)
        if self.on_batch is not None:
            stats = BatchStats(
                rows, padded, len(batch), [start - r.enqueued for r in batch], done - start
            )
            try:
                self.on_batch(stats)
            except Exception:
                logger.exception("on_batch hook failed; the batch itself was answered")


def _check_batch_outputs(outputs: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """The outputs as arrays whose leading dimension is the batch: else an ArtifactError."""
    arrays = {k: np.asarray(v) for k, v in outputs.items()}
    for name, array in arrays.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise ArtifactError(
                f"output {name!r} has shape {list(array.shape)} for a batch of {rows} rows; "
                "every output of a served model needs the batch as its leading dimension"
            )
    return arrays


def _pad(x: np.ndarray, rows: int) -> np.ndarray:
    """Pad along axis 0 by repeating the first row: always a valid input, unlike zeros."""
    if x.shape[0] == rows:
        return x
    return np.concatenate([x, np.repeat(x[:1], rows - x.shape[0], axis=0)])
