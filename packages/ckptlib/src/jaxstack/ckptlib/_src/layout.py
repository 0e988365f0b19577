"""On-disk layout of a checkpoint directory and the file operations that make it atomic.

    <directory>/
      step_00000100/              committed: renamed into place only after everything is written
        state/                    a plain Orbax PyTree checkpoint of the state (OCDBT/TensorStore)
        data_state.json           the data iterator's state (of process 0; process i>0 writes
                                  its own data_state.process_<i>.json)
        metadata.json             user metadata (config, ...)
        manifest.json             step, tree, shapes, dtypes, versions, metrics, file sha256s
      .tmp-step_00000200/         a save in progress (or the leftovers of a crashed one)
      .tmp-delete-step_00000050/  a checkpoint being deleted by retention
      damaged/step_00000300.20261201T120000Z/
                                  a step that failed its check, moved aside for inspection
      save-errors.log             what Orbax and the OS said about failed saves

The commit point is the rename of `.tmp-step_N` to `step_N`; rename of a directory is atomic on
POSIX filesystems, so a step either exists whole (with its manifest) or not at all.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"
DELETE_PREFIX = ".tmp-delete-"
STATE_DIR = "state"
DATA_STATE_FILE = "data_state.json"
METADATA_FILE = "metadata.json"
MANIFEST_FILE = "manifest.json"
DAMAGED_DIR = "damaged"
ERROR_LOG = "save-errors.log"
_STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d+)$")


def data_state_file(process_index: int) -> str:
    return DATA_STATE_FILE if process_index == 0 else f"data_state.process_{process_index}.json"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def step_dir(directory: Path, step: int) -> Path:
    return directory / step_name(step)


def tmp_dir(directory: Path, step: int) -> Path:
    return directory / f"{TMP_PREFIX}{step_name(step)}"


def committed_steps(directory: Path) -> list[int]:
    """Steps whose directory has been renamed into place, ascending (not yet verified)."""
    if not directory.is_dir():
        return []
    steps = []
    for entry in os.scandir(directory):
        match = _STEP_RE.match(entry.name)
        if match and entry.is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps)


def leftover_tmp_dirs(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(TMP_PREFIX))


def remove_tree(path: Path) -> None:
    """Delete a directory so that no half-deleted copy ever looks committed.

    It is first renamed to a temporary name (atomic), then removed; a crash in between leaves
    only a `.tmp-delete-*` directory, which the next start cleans up.
    """
    if not path.exists():
        return
    doomed = path
    if not path.name.startswith(TMP_PREFIX):
        doomed = path.with_name(f"{DELETE_PREFIX}{path.name}")
        if doomed.exists():
            shutil.rmtree(doomed)
        os.rename(path, doomed)
        fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_tree_quietly(path: Path) -> None:
    """`remove_tree`, leaving what it cannot remove to the next start's clean-up."""
    with contextlib.suppress(OSError):
        remove_tree(path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_aside(directory: Path, step: int) -> Path:
    """Move a damaged step to `damaged/` (kept for inspection, out of every listing)."""
    aside = directory / DAMAGED_DIR
    aside.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    target = aside / f"{step_name(step)}.{stamp}"
    for n in range(1, 1000):
        if not target.exists():
            break
        target = aside / f"{step_name(step)}.{stamp}-{n}"
    os.rename(step_dir(directory, step), target)
    fsync_dir(directory)
    return target


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a unique temporary path beside `path` for the caller to write; on success it is
    fsynced and renamed over `path`, so readers see the old file or the whole new one (a full
    disk or a crash leaves the old one); on failure it is removed. Unique per process and call,
    so concurrent writers never share it; hidden (a leading dot) while it is written. The file
    gets the permissions `open` would give it (the umask's): writers such as safetensors create
    theirs private (0600), which would leave a checkpoint unreadable to the group.

    Example:
      >>> with atomic_file(run_dir / "config.yaml") as tmp:
      ...     tmp.write_text(text)
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (reading it means setting it: set back at once to what it was)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path: Path, obj: Any) -> None:
    """Write JSON durably and atomically."""
    with atomic_file(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory below root, so a rename commits durable bytes."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))
