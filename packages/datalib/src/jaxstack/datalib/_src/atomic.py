"""Atomic file writes: a unique temporary file in the same folder, fsync, then rename."""

from __future__ import annotations

import contextlib
import os
import pathlib
import uuid
from collections.abc import Iterator


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Yield a unique temporary path beside `path` for the caller to write; on success it is
    fsynced and renamed over `path`, so readers see the old file or the whole new one, never
    half; on failure it is removed. Unique per process and call, so writers never share it."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
