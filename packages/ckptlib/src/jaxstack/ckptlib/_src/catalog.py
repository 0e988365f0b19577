"""Read-only views of a checkpoint directory: list steps, describe one, verify them."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from jaxstack.ckptlib._src import layout, manifest
from jaxstack.ckptlib._src.errors import CheckpointNotFoundError, CorruptCheckpointError
from jaxstack.ckptlib._src.manifest import VerificationResult


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One step directory as `list_checkpoints` sees it (from its manifest, no array reads).

    Attributes:
      step: the step number.
      path: its directory.
      ok: manifest readable and all files present with their sizes (and, when listed with
        `verify=True`, their hashes).
      problems: what is wrong when not ok.
      size_bytes: total size of its files per the manifest (0 when unreadable).
      metrics: the metrics saved with it.
      created_unix: when its save started (seconds since the epoch).
      num_leaves: number of arrays/scalars in its state.
    """

    step: int
    path: Path
    ok: bool
    problems: tuple[str, ...]
    size_bytes: int
    metrics: dict[str, Any]
    created_unix: float | None
    num_leaves: int


def require_dir(directory: str | os.PathLike[str]) -> Path:
    """`directory` as a Path, or a CheckpointNotFoundError saying it is missing or a file."""
    path = Path(os.fspath(directory))
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise CheckpointNotFoundError(f"checkpoint directory {path} {what}")
    return path


def require_steps(root: Path) -> list[int]:
    """The committed steps of `root`, or the error that says what a checkpoint folder holds."""
    steps = layout.committed_steps(root)
    if not steps:
        raise CheckpointNotFoundError(missing_checkpoints_message(root))
    return steps


def missing_checkpoints_message(root: Path) -> str:
    """`no checkpoint in ROOT`, pointing at the folders below it that hold checkpoints."""
    found = [
        p
        for p in sorted(root.glob("*")) + sorted(root.glob("*/*"))
        if p.is_dir() and layout.committed_steps(p)
    ]
    if found:
        where = ", ".join(str(p) for p in found[:3])
        return f"no checkpoint in {root}; checkpoints found in: {where}"
    return (
        f"no checkpoint in {root}: a checkpoint folder holds {layout.STEP_PREFIX}NNNNNNNN "
        "directories (for a jaxstack-train run: RUN_DIR/checkpoints)"
    )


def list_checkpoints(
    directory: str | os.PathLike[str], *, verify: bool = False
) -> list[CheckpointInfo]:
    """Every committed step directory in `directory`, ascending, each checked.

    Args:
      directory: a checkpoint directory.
      verify: recompute every file's hash (reads every byte: finds flipped bits too); by
        default only the manifest and the file sizes are checked.
    """
    root = require_dir(directory)
    infos = []
    for step in layout.committed_steps(root):
        path = layout.step_dir(root, step)
        check = manifest.verify(path) if verify else manifest.quick_check(path)
        try:
            record = manifest.load(path)
        except (OSError, ValueError):
            record = {}
        infos.append(
            CheckpointInfo(
                step=step,
                path=path,
                ok=check.ok,
                problems=check.problems,
                size_bytes=sum(f["size"] for f in record.get("files", {}).values()),
                metrics=record.get("metrics", {}),
                created_unix=record.get("created_unix"),
                num_leaves=len(record.get("leaves", [])),
            )
        )
    return infos


def read_manifest(directory: str | os.PathLike[str], step: int | None = None) -> dict[str, Any]:
    """The manifest of `step` (default: the newest step whose manifest reads)."""
    root = require_dir(directory)
    steps = require_steps(root)
    if step is not None and step not in steps:
        raise CheckpointNotFoundError(f"no checkpoint of step {step} in {root}; steps: {steps}")
    problems = []
    for s in [step] if step is not None else reversed(steps):
        try:
            return manifest.load(layout.step_dir(root, s))
        except (OSError, ValueError) as e:
            problems.append(f"{layout.step_name(s)}: {e}")
    raise CorruptCheckpointError(
        f"no readable manifest in {root} ({'; '.join(problems)}); "
        "`jaxstack-ckpt verify` tells what else is damaged"
    )


def verify_checkpoints(
    directory: str | os.PathLike[str], step: int | None = None
) -> list[VerificationResult]:
    """Recompute content hashes of `step`, or of every committed step when None.

    Raises:
      CheckpointNotFoundError: `directory` holds no checkpoint (the message names the folders
        below it that do), or no checkpoint of `step`.
    """
    root = require_dir(directory)
    steps = require_steps(root)
    if step is not None:
        if step not in steps:
            raise CheckpointNotFoundError(f"no checkpoint of step {step} in {root}; steps: {steps}")
        steps = [step]
    return [manifest.verify(layout.step_dir(root, s)) for s in steps]
