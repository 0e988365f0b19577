"""Input wiring: tokenizer, datalib pipelines per data shard, and a prefetching thread.

The global batch is cut into `num_shards` equal data shards (default: one per process). Each
process reads its own shards with datalib (`shard_index/shard_count`) and concatenates them, so a
single process that reads both shards of a two-shard layout sees exactly the global batch a
two-process run assembles, which is what lets multi-host runs be checked against one process.
A background thread keeps `depth` batches ready (already placed on the devices) together with
the iterator state *after* each batch, so a checkpoint records exactly the consumed position.
"""

from __future__ import annotations

import contextlib
import pathlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxstack.trainer._src.config import DataConfig
from jaxstack.trainer._src.errors import DataError

BATCH_KEYS = ("tokens", "targets", "segment_ids", "positions", "loss_mask")


def build_tokenizer(data: DataConfig) -> Any:
    """datalib's ByteTokenizer, or a BPE tokenizer read from `data.tokenizer` (a JSON path)."""
    from jaxstack import datalib

    if data.tokenizer == "byte":
        return datalib.ByteTokenizer()
    path = pathlib.Path(data.tokenizer)
    if not path.is_file():
        raise DataError(
            f"data.tokenizer={data.tokenizer!r}: no such tokenizer file; use 'byte' or the path "
            "of a tokenizer JSON saved by datalib.BPETokenizer.save"
        )
    return datalib.BPETokenizer.from_file(str(path))


def check_data_path(data: DataConfig) -> None:
    """Fails fast (before any model build or compile) when a data path is missing or empty."""
    for key in ("path", "validation_path"):
        value = getattr(data, key)
        if value is None:
            continue
        path = pathlib.Path(value).expanduser()
        if not path.exists():
            raise DataError(
                f"data.{key}={value!r} does not exist; point it at a text file or a folder of "
                ".txt files, or leave data.path unset (null) to use datalib's default corpus"
            )
        if path.is_dir() and not any(path.rglob("*.txt")):
            raise DataError(f"data.{key}={value!r} is a folder without any .txt files")
        if path.is_file() and path.stat().st_size == 0:
            raise DataError(f"data.{key}={value!r} is an empty file; give it some text")
    if data.validation_path is not None and data.path is None:
        raise DataError("data.validation_path is set but data.path is not; set both or neither")


def document_source(data: DataConfig, split: str) -> Any:
    """A random-access source of documents for `split` ("train" or "validation").

    Without `data.path` this is datalib's default corpus with its fixed split. With one, the
    validation split reads `data.validation_path`, or the training files when that is unset.
    """
    from jaxstack import datalib

    if data.path is None:
        return datalib.default_corpus(split=split)
    path = data.path if split == "train" else (data.validation_path or data.path)
    path = pathlib.Path(path).expanduser()
    return datalib.TextSource(str(path / "**" / "*.txt") if path.is_dir() else str(path))


def shard_iterators(
    data: DataConfig,
    tokenizer: Any,
    *,
    split: str,
    shards: list[int],
    num_shards: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
) -> list[Any]:
    """One datalib iterator per data shard this process reads."""
    from jaxstack import datalib

    source = document_source(data, split)
    per_shard = data.batch_size // num_shards
    return [
        datalib.lm_batches(
            source,
            tokenizer,
            seq_len=data.seq_len,
            batch_size=per_shard,
            seed=data.seed,
            shard_index=i,
            shard_count=num_shards,
            num_workers=data.num_workers,
            packing=data.packing,
            num_epochs=num_epochs,
            shuffle=shuffle,
        )
        for i in shards
    ]


def next_local_batch(iterators: list[Any]) -> dict[str, np.ndarray]:
    """The next batch of every shard iterator, concatenated along the batch axis."""
    parts = [next(it) for it in iterators]
    return {k: np.concatenate([np.asarray(p[k]) for p in parts], axis=0) for k in BATCH_KEYS}


def iterator_states(iterators: list[Any]) -> list[dict[str, Any]]:
    return [it.get_state() for it in iterators]


def restore_iterator_states(iterators: list[Any], states: list[dict[str, Any]]) -> None:
    if len(states) != len(iterators):
        raise DataError(
            f"the checkpoint holds {len(states)} data-shard states but this run reads "
            f"{len(iterators)} shards; resume with the same data.num_shards / process count"
        )
    for it, state in zip(iterators, states, strict=True):
        it.set_state(state)


class Prefetcher:
    """Keeps up to `depth` device batches ready in a background thread.

    `next()` returns `(batch, states)` where `states` are the shard iterator states right after
    that batch was read. Errors in the thread are re-raised in the caller.
    """

    def __init__(
        self,
        iterators: list[Any],
        put: Callable[[dict[str, np.ndarray]], Any],
        *,
        depth: int = 2,
        limit: int | None = None,
    ) -> None:
        self._iterators = iterators
        self._put = put
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._limit = limit
        self._thread = threading.Thread(target=self._run, name="jaxstack-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        produced = 0
        try:
            while not self._stop.is_set() and (self._limit is None or produced < self._limit):
                host = next_local_batch(self._iterators)
                states = iterator_states(self._iterators)
                item = (self._put(host), states)
                produced += 1
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer
            self._queue.put(("error", e))

    def next(self) -> tuple[Any, list[dict[str, Any]]]:
        item = self._queue.get()
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            raise item[1]
        return item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
            self._thread.join(timeout=0.05)


def iterate_eval(iterators: list[Any], batches: int) -> Iterator[dict[str, np.ndarray]]:
    for _ in range(batches):
        try:
            yield next_local_batch(iterators)
        except StopIteration:
            return
