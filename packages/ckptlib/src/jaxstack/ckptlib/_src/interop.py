"""Plain Orbax checkpoints in, params-only exports out.

ckptlib's `step_N/state` is a plain Orbax PyTree checkpoint, so Orbax restores it directly (see
docs/ckptlib.md); in the other direction `restore_orbax` reads any Orbax PyTree checkpoint
(`ocp.StandardCheckpointer().save(path, tree)`, or an item directory of an Orbax
CheckpointManager such as `<dir>/<step>/default`) with ckptlib's target matching and resharding.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxstack.ckptlib._src import catalog, multihost, paths, restore, tree
from jaxstack.ckptlib._src.errors import CheckpointNotFoundError, Error
from jaxstack.ckptlib._src.manager import CheckpointManager
from jaxstack.ckptlib._src.safetensors import NameMap, save_safetensors


def restore_orbax(
    path: str | os.PathLike[str], *, target: Any = None, subtree: str | None = None
) -> Any:
    """Restore a plain Orbax PyTree checkpoint.

    Args:
      path: the checkpoint directory (the one holding `_METADATA`).
      target: as for `CheckpointManager.restore`: arrays take its shardings and dtypes and the
        result has its exact structure; None returns Orbax's saved structure (dicts and lists;
        NamedTuples were saved as dicts) with arrays on one local device.
      subtree: restore only the leaves under this `/`-path.
    """
    root = Path(os.fspath(path))
    if not root.is_dir():
        raise CheckpointNotFoundError(f"Orbax checkpoint directory {root} does not exist")
    saved_tree, saved = restore.saved_leaves_from_orbax(root)
    prefix = tuple(subtree.strip("/").split("/")) if subtree else ()
    flat, treedef = restore.restore_leaves(
        root, saved_tree, saved, target=target, has_target=target is not None, prefix=prefix
    )
    if target is not None:
        t_paths, _, _ = tree.flatten(target)
        return jax.tree_util.tree_unflatten(treedef, [flat[p] for p in t_paths])

    sub = saved_tree
    for part in prefix:
        sub = sub[int(part)] if isinstance(sub, list) else sub[part]
    return jax.tree_util.tree_map_with_path(lambda keys, _: flat[paths.key_names(keys)], sub)


def export_params(
    directory: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    step: int | None = None,
    subtree: str | None = "params",
    format: str = "safetensors",
    name_map: NameMap = None,
) -> Path:
    """Write only `subtree` (default the params) of a checkpoint, for serving.

    Args:
      directory: a ckptlib checkpoint directory.
      out: the output file (safetensors) or directory (orbax).
      step: the step to export (default: the newest good one).
      subtree: the `/`-path of what to export; None exports the whole state.
      format: "safetensors" (one file, with `name_map`) or "orbax" (a plain Orbax PyTree
        checkpoint of NumPy arrays that `ocp.StandardCheckpointer().restore` reads).
    """
    if format not in ("safetensors", "orbax"):
        raise Error(f"format={format!r}: use 'safetensors' or 'orbax'")
    directory = catalog.require_dir(directory)
    catalog.require_steps(directory)
    manager = CheckpointManager(directory, read_only=True)
    try:
        restored = manager.restore(step, subtree=subtree)
    finally:
        manager.close()
    params = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), restored.state)
    out = Path(os.fspath(out))
    if format == "safetensors":
        save_safetensors(
            params,
            out,
            name_map=name_map,
            metadata={"source": str(directory), "step": str(restored.step)},
        )
    else:
        checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
        try:
            checkpointer.save(out.absolute(), args=ocp.args.PyTreeSave(params))
        finally:
            checkpointer.close()
        multihost.barrier(f"jaxstack_ckptlib.export.{out}.{restored.step}")
    return out
