"""Writing files atomically: the whole new file or the old one, never half, even on a full disk."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_text_atomically(target: Path, text: str) -> None:
    """Writes `text` under a unique hidden name beside `target`, fsyncs it, renames it over
    `target`; on failure (a full disk) the temporary file is removed and `target` untouched."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
