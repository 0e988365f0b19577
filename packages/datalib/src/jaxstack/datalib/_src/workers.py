"""Grain's multi-process prefetch made safe for library use.

Two things stand between `mp_prefetch` and a plain Python program: it reads absl flags (and
fails if the program never parsed them), and an iterator left to the garbage collector at
interpreter exit prints tracebacks and leaks shared memory. `ensure_absl_flags` marks the flags
parsed with their defaults when nobody parsed them; `register`/`close_all` close every live
worker-backed iterator at exit, before module teardown.
"""

from __future__ import annotations

import atexit
import gc
import weakref
from typing import Protocol

import grain

from jaxstack.datalib._src import nojax


class _Closable(Protocol):
    def close(self) -> None: ...


_LIVE: weakref.WeakSet = weakref.WeakSet()
_STARTED_ANY = False

# Measured on 2 cores (benchmarks/datalib, whole pipeline): Grain's default 16 reader threads and
# 500-element buffer cost 1.2x (byte tokens) to 3.5x (BPE) in tokens per CPU second; reading
# in the consuming thread was the best default for both.
FAST_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
DEFAULT_WORKER_BUFFER = 4
# Measured (benchmarks/datalib): Grain moves every array from a worker through a new shared
# memory segment by default; for [8, 1024] int32 batch arrays, sending arrays below 1 MiB through
# the worker queue instead gave 1.2-1.4x the tokens per second with 2 workers.
MIN_SHM_BYTES = 1 << 20


def ensure_absl_flags() -> None:
    """Let Grain read its absl flags (defaults) in programs that do not use absl."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    nojax.mark_children()


def in_workers(
    dataset: grain.IterDataset, num_workers: int, buffer_size: int = DEFAULT_WORKER_BUFFER
) -> grain.IterDataset:
    """`dataset.mp_prefetch` with datalib's measured settings, safe in any program."""
    ensure_absl_flags()
    dataset = grain.experimental.WithOptionsIterDataset(
        dataset, grain.experimental.DatasetOptions(min_shm_size=MIN_SHM_BYTES)
    )
    options = grain.MultiprocessingOptions(
        num_workers=num_workers, per_worker_buffer_size=buffer_size
    )
    return dataset.mp_prefetch(options)


def register(iterator: _Closable) -> None:
    """Close `iterator` at interpreter exit (before module teardown) if the user has not."""
    global _STARTED_ANY
    _STARTED_ANY = True
    _LIVE.add(iterator)


def collect_cycles() -> None:
    """Free Grain's helper iterators, which it keeps in reference cycles, while modules live."""
    if _STARTED_ANY:
        gc.collect()


@atexit.register
def close_all() -> None:
    for iterator in list(_LIVE):
        iterator.close()
    collect_cycles()
