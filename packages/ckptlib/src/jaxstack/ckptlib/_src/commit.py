"""The commit of one step: every process writes into `.tmp-step_N`, process 0 renames it.

    open_tmp   process 0 creates `.tmp-step_N` with the JSON parts; every process adds its
               own data state (each reads its own shard of the data)
    (Orbax writes `state/`, each process its own shards)
    commit     once every process has written: process 0 fsyncs, hashes every file into
               `manifest.json` and renames `.tmp-step_N` to `step_N` (the commit point)

Barrier keys name the step and the save, so every process passes the same points in order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from jaxstack.ckptlib._src import layout, manifest, multihost
from jaxstack.ckptlib._src.snapshot import Snapshot


def open_tmp(directory: Path, step: int, snap: Snapshot, key: str) -> Path:
    """Create `.tmp-step_N` holding the snapshot's JSON parts; returns its path."""
    tmp = layout.tmp_dir(directory, step)
    if multihost.is_primary():
        layout.remove_tree(tmp)
        tmp.mkdir()
        if snap.metadata is not None:
            layout.write_json(tmp / layout.METADATA_FILE, snap.metadata)
    multihost.barrier(f"{key}.tmp")
    if snap.data_state is not None:
        name = layout.data_state_file(jax.process_index())
        layout.write_json(tmp / name, snap.data_state)
    return tmp


def commit(
    directory: Path,
    step: int,
    tmp: Path,
    header: dict[str, Any],
    key: str,
    *,
    before_rename: Callable[[int], None] | None = None,
    after_commit: Callable[[], None] | None = None,
) -> None:
    """Make `tmp` the committed `step_N` once every process's files are written."""
    multihost.barrier(f"{key}.written")
    if multihost.is_primary():
        layout.fsync_tree(tmp)
        layout.write_json(tmp / layout.MANIFEST_FILE, manifest.build(tmp, header))
        if before_rename is not None:
            before_rename(step)
        os.rename(tmp, layout.step_dir(directory, step))
        layout.fsync_dir(directory)
        if after_commit is not None:
            after_commit()
    multihost.barrier(f"{key}.committed")
