"""What one save writes, taken before `save` returns, so the caller may mutate its state after.

A snapshot is the PyTree handed to Orbax (arrays the caller cannot change any more), the JSON
parts (deep copies), and the manifest header (step, tree description, leaf shapes and dtypes,
versions, metrics) that the commit completes with file hashes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxstack.ckptlib._src import tree
from jaxstack.ckptlib._src.errors import Error
from jaxstack.ckptlib._src.versions import package_versions


@dataclasses.dataclass(frozen=True)
class Snapshot:
    orbax_tree: Any
    header: dict[str, Any]
    data_state: Any
    metadata: Any


def json_copy(value: Any, name: str) -> Any:
    """A deep copy through JSON, so later mutation by the caller cannot change the checkpoint."""
    if value is None:
        return None
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise Error(
            f"{name} must be JSON-serialisable (dicts, lists, str, int, finite float, bool, None); "
            f"{e}. Convert arrays with .tolist() and objects to dicts before saving."
        ) from e


def _copy_leaf(path: tree.Path, leaf: Any) -> Any:
    leaf = tree.storage_form(leaf)
    if isinstance(leaf, jax.Array):
        return leaf  # immutable; Orbax copies it to host before save() returns
    if isinstance(leaf, np.ndarray | np.generic):
        return np.array(leaf, copy=True)
    if isinstance(leaf, bool | int | float):
        return np.asarray(leaf)
    raise Error(
        f"leaf {tree.path_str(path)!r} has type {type(leaf).__name__}; a checkpointed state may "
        "hold jax/numpy arrays and Python scalars only (no pickled objects)"
    )


def _check_metrics(metrics: Mapping[str, float] | None) -> dict[str, float | None]:
    if metrics is None:
        return {}
    out: dict[str, float | None] = {}
    for name, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError) as e:
            raise Error(f"metrics[{name!r}]={value!r} is not a number") from e
        # JSON has no NaN; such a step never ranks as best.
        out[str(name)] = number if math.isfinite(number) else None
    return out


def _leaf_record(path: tree.Path, leaf: Any) -> dict[str, Any]:
    stored = tree.storage_form(leaf)
    dtype = stored.dtype if hasattr(stored, "dtype") else np.asarray(stored).dtype
    return {
        "path": list(path),
        "shape": list(np.shape(stored)),
        "dtype": np.dtype(dtype).name,
        "kind": tree.leaf_kind(leaf),
    }


def take(
    step: int,
    state: Any,
    *,
    data_state: Any,
    metadata: Any,
    metrics: Mapping[str, float] | None,
) -> Snapshot:
    """Validate and copy everything `save(step, state, ...)` writes."""
    data_state = json_copy(data_state, "data_state")
    metadata = json_copy(metadata, "metadata")
    checked_metrics = _check_metrics(metrics)
    paths, leaves, treedef = tree.flatten(state)
    if not leaves:
        raise Error("state has no array leaves; there is nothing to checkpoint")
    header = {
        "step": step,
        "created_unix": time.time(),
        "process_count": jax.process_count(),
        "versions": package_versions(),
        "metrics": checked_metrics,
        "tree": tree.describe(state),
        "leaves": [_leaf_record(p, leaf) for p, leaf in zip(paths, leaves, strict=True)],
        "has_data_state": data_state is not None,
        "has_metadata": metadata is not None,
    }
    copies = [_copy_leaf(p, x) for p, x in zip(paths, leaves, strict=True)]
    # Orbax gets the state's own structure, so plain Orbax restores it with the usual abstract
    # target (it writes NamedTuples as dicts and tuples as lists).
    orbax_tree = jax.tree_util.tree_unflatten(treedef, copies)
    return Snapshot(orbax_tree, header, data_state, metadata)
