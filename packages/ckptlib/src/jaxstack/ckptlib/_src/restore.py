"""Restoring an Orbax PyTree checkpoint into a target, by leaf path, with resharding.

Both ckptlib's own `state/` directories and plain Orbax PyTree checkpoints go through here. The
saved tree is read from metadata (never by unpickling); each leaf is matched to the target leaf
with the same `/`-path, so the target's container types (optax NamedTuples, nnx.State) do not
have to match what Orbax wrote (dicts and lists). Arrays come back with the target's shardings:
Orbax/TensorStore read only the slices each device needs, which is what makes a restore onto a
different mesh cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxstack.ckptlib._src import layout, manifest, paths, tree
from jaxstack.ckptlib._src.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TargetMismatchError,
)
from jaxstack.ckptlib._src.tree import Path as TreePath

_MAX_REPORTED = 5


@dataclasses.dataclass(frozen=True)
class SavedLeaf:
    """What a checkpoint says about one leaf."""

    shape: tuple[int, ...]
    dtype: str
    kind: str  # "jax" | "numpy" | "int" | "float" | "bool"


def saved_leaves_from_orbax(path: Path) -> tuple[Any, dict[TreePath, SavedLeaf]]:
    """The saved metadata tree of a plain Orbax PyTree checkpoint and its leaves by path."""
    if not (path / "_METADATA").exists():
        raise CheckpointNotFoundError(
            f"{path} is not an Orbax PyTree checkpoint (no _METADATA file); pass the item "
            "directory, e.g. <orbax_dir>/<step>/default"
        )
    meta = ocp.PyTreeCheckpointer().metadata(path)
    saved_tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
    leaves: dict[TreePath, SavedLeaf] = {}
    for keys, leaf in jax.tree_util.tree_flatten_with_path(saved_tree)[0]:
        p = paths.key_names(keys)
        dtype = np.dtype(leaf.dtype)
        if type(leaf).__name__ == "ScalarMetadata":
            kind = {"i": "int", "u": "int", "f": "float", "b": "bool"}.get(dtype.kind, "numpy")
        else:
            kind = "jax"
        leaves[p] = SavedLeaf(tuple(leaf.shape), dtype.name, kind)
    return saved_tree, leaves


def check_target(
    saved: Mapping[TreePath, SavedLeaf], target_paths: list[TreePath], target_leaves: list[Any]
) -> None:
    """Raise TargetMismatchError naming the first differing paths (missing, extra, shape)."""
    problems = []
    target_set = set(target_paths)
    for p, leaf in zip(target_paths, target_leaves, strict=True):
        if p not in saved:
            problems.append(f"{tree.path_str(p)}: in the target, not in the checkpoint")
            continue
        shape = tuple(np.shape(leaf)) if not hasattr(leaf, "shape") else tuple(leaf.shape)
        if tree.is_prng_key(leaf):  # stored as key data: one or more trailing dimensions
            shape += saved[p].shape[len(shape) :]
        if shape != saved[p].shape:
            problems.append(
                f"{tree.path_str(p)}: checkpoint shape {saved[p].shape}, target shape {shape}"
            )
    problems += [
        f"{tree.path_str(p)}: in the checkpoint, not in the target"
        for p in saved
        if p not in target_set
    ]
    if problems:
        shown = "; ".join(problems[:_MAX_REPORTED])
        extra = len(problems) - _MAX_REPORTED
        more = f" (and {extra} more)" if extra > 0 else ""
        raise TargetMismatchError(
            f"the restore target does not match the checkpoint at {len(problems)} path(s): "
            f"{shown}{more}. Build the target from the same model/optimizer config as the run "
            "that saved, or restore without a target (or inspect with `jaxstack-ckpt inspect`)."
        )


def _local_device_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _restore_args_for_target(leaf: Any, saved: SavedLeaf) -> tuple[ocp.RestoreArgs, str]:
    """(Orbax restore args, kind to return) for one target leaf."""
    if tree.is_prng_key(leaf):
        sharding = getattr(leaf, "sharding", None) or _local_device_sharding()
        args = ocp.ArrayRestoreArgs(sharding=sharding, global_shape=saved.shape, dtype=np.uint32)
        kind = saved.kind if saved.kind.startswith("prng_key:") else f"prng_key:{_key_impl(leaf)}"
        return args, kind
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        sharding = getattr(leaf, "sharding", None) or _local_device_sharding()
        args = ocp.ArrayRestoreArgs(sharding=sharding, global_shape=leaf.shape, dtype=leaf.dtype)
        return args, "jax"
    if isinstance(leaf, np.ndarray | np.generic):
        return ocp.RestoreArgs(restore_type=np.ndarray, dtype=leaf.dtype), "numpy"
    kind = tree.leaf_kind(leaf)
    if kind in ("int", "float", "bool"):
        return ocp.RestoreArgs(restore_type=np.ndarray), kind
    raise TargetMismatchError(
        f"target leaf of type {type(leaf).__name__} is not restorable; use jax.Array, "
        "jax.ShapeDtypeStruct (with a sharding), numpy arrays or Python scalars"
    )


def _key_impl(leaf: Any) -> str:
    if isinstance(leaf, jax.Array):
        return str(jax.random.key_impl(leaf))
    # An abstract key (ShapeDtypeStruct): the impl is part of its dtype.
    return str(leaf.dtype._impl.name)


def _restore_args_for_saved(saved: SavedLeaf) -> tuple[ocp.RestoreArgs, str]:
    if saved.kind == "jax" or saved.kind.startswith("prng_key:"):
        return ocp.ArrayRestoreArgs(sharding=_local_device_sharding()), saved.kind
    return ocp.RestoreArgs(restore_type=np.ndarray), saved.kind


def _convert(value: Any, kind: str, target_leaf: Any = None) -> Any:
    if kind.startswith("prng_key:"):
        return jax.random.wrap_key_data(value, impl=kind.partition(":")[2])
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        return bool(value)
    if kind == "numpy" and isinstance(target_leaf, np.generic):
        return target_leaf.dtype.type(value)
    return value


def restore_leaves(
    path: Path,
    saved_tree: Any,
    saved: Mapping[TreePath, SavedLeaf],
    *,
    target: Any = None,
    has_target: bool = False,
    prefix: TreePath = (),
) -> tuple[dict[TreePath, Any], Any]:
    """Restore the leaves under `prefix`; returns ({path below prefix: value}, target treedef).

    `saved_tree` has Orbax's saved structure (nested dicts/lists, leaves are anything); only the
    leaves under `prefix` are read (Orbax partial restore), each with args from the matching
    target leaf or, without a target, from what was saved.
    """
    wanted = {p[len(prefix) :]: leaf for p, leaf in saved.items() if p[: len(prefix)] == prefix}
    if not wanted:
        raise TargetMismatchError(
            f"the checkpoint has no leaves under {tree.path_str(prefix)!r}; "
            f"top-level keys are {sorted({p[0] for p in saved})}"
        )
    treedef = None
    if has_target:
        t_paths, t_leaves, treedef = tree.flatten(target)
        check_target(wanted, t_paths, t_leaves)
        chosen = {
            p: (*_restore_args_for_target(leaf, wanted[p]), leaf)
            for p, leaf in zip(t_paths, t_leaves, strict=True)
        }
    else:
        chosen = {p: (*_restore_args_for_saved(s), None) for p, s in wanted.items()}

    def args_for(keys: Any, _: Any) -> Any:
        p = paths.key_names(keys)
        if p[: len(prefix)] != prefix:
            return None
        return chosen[p[len(prefix) :]][0]

    restore_args = jax.tree_util.tree_map_with_path(args_for, saved_tree)
    item = None
    if prefix:
        restore_args = _prune(restore_args, prefix)
        item = jax.tree.map(lambda _: 0, restore_args)
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    try:
        restored = checkpointer.restore(
            path,
            args=ocp.args.PyTreeRestore(
                item=item, restore_args=restore_args, partial_restore=bool(prefix)
            ),
        )
    finally:
        checkpointer.close()
    flat = {}
    for keys, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
        p = paths.key_names(keys)[len(prefix) :]
        _, kind, target_leaf = chosen[p]
        flat[p] = _convert(value, kind, target_leaf)
    return flat, treedef


def load_step(path: Path, target: Any, subtree: str | None) -> Any:
    """The state (or `subtree` of it) of the committed step directory `path`."""
    record = manifest.load(path)
    saved = {
        tuple(leaf["path"]): SavedLeaf(tuple(leaf["shape"]), leaf["dtype"], leaf["kind"])
        for leaf in record["leaves"]
    }
    saved_tree, on_disk = saved_leaves_from_orbax(path / layout.STATE_DIR)
    if set(on_disk) != set(saved):
        raise CorruptCheckpointError(
            f"{path}: the Orbax metadata and the manifest list different leaves"
        )
    prefix = tuple(subtree.strip("/").split("/")) if subtree else ()
    flat, treedef = restore_leaves(
        path / layout.STATE_DIR,
        saved_tree,
        saved,
        target=target,
        has_target=target is not None,
        prefix=prefix,
    )
    if target is None:
        return tree.rebuild(tree.subdescription(record["tree"], prefix), flat)
    t_paths, _, _ = tree.flatten(target)
    return jax.tree_util.tree_unflatten(treedef, [flat[p] for p in t_paths])


def _prune(node: Any, prefix: TreePath) -> Any:
    """Only the branch of `node` along `prefix` (dicts and lists), for a partial restore."""
    if not prefix:
        return node
    head, rest = prefix[0], prefix[1:]
    if isinstance(node, Mapping):
        return {head: _prune(node[head], rest)}
    raise TargetMismatchError(f"cannot select {head!r} inside a {type(node).__name__}")
