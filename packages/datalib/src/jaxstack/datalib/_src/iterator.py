"""`LMBatchIterator`: Grain's iterator state as a small, versioned JSON dict, and clean shutdown.

Grain's own state (source position, packer position, per-worker states) is exact but holds
Python tuples and possibly non-string keys, which plain JSON would silently turn into lists and
strings; `to_json_safe`/`from_json_safe` tag them so a state survives a JSON round trip exactly.
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from typing import Any

import numpy as np

from jaxstack.datalib._src import workers
from jaxstack.datalib._src.errors import StateError
from jaxstack.datalib._src.nojax import grain
from jaxstack.datalib._src.shuffle import TABLE_LIMIT

STATE_VERSION = 2
"""2: sources of up to `shuffle.TABLE_LIMIT` documents are shuffled in another order than by
version 1 (datalib <= 0.3), whose states still restore their position (with a warning)."""


_TUPLE = "__tuple__"
_ITEMS = "__items__"


def to_json_safe(value: Any) -> Any:
    """Grain's iterator state as JSON types, with tuples and non-string keys tagged.

    (Grain compares some state entries, e.g. concat-then-split's remainder slices, with tuple
    constants, so a list in their place would silently change the restored position.)
    """
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: to_json_safe(v) for k, v in value.items()}
        return {_ITEMS: [[to_json_safe(k), to_json_safe(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {_TUPLE: [to_json_safe(v) for v in value]}
    if isinstance(value, list):
        return [to_json_safe(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise StateError(f"iterator state holds a {type(value).__name__}, which JSON cannot carry")


def from_json_safe(value: Any) -> Any:
    """The inverse of `to_json_safe`."""
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(from_json_safe(v) for v in value[_TUPLE])
        if set(value) == {_ITEMS}:
            return {_hashable(from_json_safe(k)): from_json_safe(v) for k, v in value[_ITEMS]}
        return {k: from_json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_safe(v) for v in value]
    return value


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


class LMBatchIterator(grain.DatasetIterator):
    """A Grain `DatasetIterator` of LM batches with a JSON state and clean shutdown.

    `get_state()` returns {"version", "config", "config_hash", "grain"} (a few hundred bytes);
    `set_state(state)` refuses a state from a pipeline with another configuration. Use it as a
    context manager or call `close()` to stop worker processes early; otherwise they are
    stopped at interpreter exit.
    """

    def __init__(self, dataset: grain.IterDataset, config: dict[str, Any]):
        self._inner = dataset.__iter__()
        super().__init__(self._inner)
        self._config = config
        self._config_hash = hashlib.sha256(
            json.dumps(config, sort_keys=True).encode("utf-8")
        ).hexdigest()[:16]
        self._copy_out = config["num_workers"] > 0
        workers.register(self)

    @property
    def config(self) -> dict[str, Any]:
        """The arguments that define the pipeline (and its states)."""
        return copy.deepcopy(self._config)

    def _live(self) -> grain.DatasetIterator:
        if self._inner is None:
            raise StateError(f"{self} is closed; build a new one with lm_batches")
        return self._inner

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._live())
        if self._copy_out:
            # Large batches from workers live in shared memory; owning copies let it be freed
            # now rather than at interpreter exit. (Small ones arrive as plain arrays.)
            batch = {k: v if type(v) is np.ndarray else np.array(v) for k, v in batch.items()}
        return batch

    def get_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "config": copy.deepcopy(self._config),
            "config_hash": self._config_hash,
            "grain": to_json_safe(self._live().get_state()),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "grain" not in state:
            raise StateError(
                "not an lm_batches state (expected a dict from LMBatchIterator.get_state())"
            )
        if state.get("version") == 1:
            warnings.warn(
                "this data state is from jaxstack-datalib 0.3 or older, which shuffled sources of "
                f"up to {TABLE_LIMIT:,} documents in another order: the position is restored, "
                "but the rest of the current epoch follows the new order (a few of its documents "
                "may come twice or not at all); later epochs are whole",
                stacklevel=2,
            )
        elif state.get("version") != STATE_VERSION:
            raise StateError(f"state version {state.get('version')!r}; this is {STATE_VERSION}")
        if state.get("config_hash") != self._config_hash:
            theirs = state.get("config", {})
            diff = sorted(
                k for k in set(theirs) | set(self._config) if theirs.get(k) != self._config.get(k)
            )
            raise StateError(
                f"state belongs to a pipeline with different settings ({', '.join(diff)}); "
                "rebuild lm_batches with the same arguments to restore it"
            )
        self._live().set_state(from_json_safe(state["grain"]))

    def close(self) -> None:
        """Stop worker processes and free their shared memory (idempotent)."""
        inner = getattr(self, "_inner", None)
        if inner is None:
            return
        # Drop every reference into Grain's iterator chain, so it is freed now and not during
        # interpreter teardown (where Grain's __del__ would print tracebacks).
        self._inner = None
        self._parents = ()
        inner.close()
        del inner
        workers.collect_cycles()

    def __enter__(self) -> LMBatchIterator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __str__(self) -> str:
        return f"LMBatchIterator({self._config['packing']}, seq_len={self._config['seq_len']})"
