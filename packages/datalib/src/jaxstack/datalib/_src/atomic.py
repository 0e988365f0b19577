"""Atomic file writes: a temporary file in the same folder, fsync, then rename."""

from __future__ import annotations

import os
import pathlib
import tempfile


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, never half."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
