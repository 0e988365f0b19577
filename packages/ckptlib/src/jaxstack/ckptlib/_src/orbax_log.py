"""Orbax's error logging during a ckptlib save goes to a log file instead of the console.

When a write fails (a full disk, say), Orbax logs the same exception with its traceback from
every thread that saw it: hundreds of lines ahead of the one error that matters. ckptlib turns
the failure into one `CheckpointSaveError`, so while one of its saves is in flight the records
that Orbax logs (and asyncio's reports of Orbax tasks) are kept, and written to the checkpoint
directory's `save-errors.log` only if the save fails. Records from anything else, and Orbax
records while no ckptlib save runs, pass through untouched.
"""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
import threading
import traceback
from pathlib import Path

import orbax.checkpoint

_ORBAX_DIR = os.path.dirname(orbax.checkpoint.__file__)
_LOGGERS = ("absl", "asyncio")  # Orbax logs through absl; asyncio reports failed Orbax tasks
_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(message)s")
_lock = threading.Lock()
_active: list[Capture] = []
_installed = False


def _from_orbax(record: logging.LogRecord) -> bool:
    if record.pathname.startswith(_ORBAX_DIR):
        return True
    tb = record.exc_info[2] if record.exc_info else None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_ORBAX_DIR):
            return True
        tb = tb.tb_next
    return False


class _Divert(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not _active or not _from_orbax(record):
            return True
        text = _FORMAT.format(record)
        with _lock:
            for capture in _active:
                capture.records.append(text)
        return False


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            for name in _LOGGERS:
                logging.getLogger(name).addFilter(_Divert())
            _installed = True


class Capture:
    """Orbax's log records from `start()` to `stop()` (one per save)."""

    def __init__(self) -> None:
        self.records: list[str] = []

    def start(self) -> Capture:
        _install()
        with _lock:
            _active.append(self)
        return self

    def stop(self) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)


def write_error_log(path: Path, what: str, capture: Capture, error: BaseException) -> Path:
    """Append `what`, Orbax's records and `error`'s traceback to `path`; returns where they went
    (a file in the temporary folder when `path` cannot be written, e.g. on a full disk)."""
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = "".join(
        [
            f"=== {stamp} {what}\n",
            *(f"{r}\n" for r in capture.records),
            *traceback.format_exception(error),
            "\n",
        ]
    )
    fallback = Path(tempfile.gettempdir()) / f"jaxstack-ckptlib-{os.getpid()}-{path.name}"
    for target in (path, fallback):
        try:
            with open(target, "a") as f:
                f.write(text)
            return target
        except OSError:
            continue
    return fallback
