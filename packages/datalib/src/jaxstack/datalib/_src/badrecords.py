"""The switch between failing on bad input and skipping it (with a count)."""

from __future__ import annotations

import logging
from typing import Literal

from jaxstack.datalib._src.errors import ConfigError, SourceError

OnError = Literal["raise", "skip"]
_log = logging.getLogger("jaxstack.datalib")
_MAX_LOGGED = 10


class BadRecords:
    """Raises `SourceError` (mode "raise") or counts and logs the first few (mode "skip").

    Counts are per process: with `num_workers > 0` each worker keeps its own, and the skipped
    records are reported in that worker's log.
    """

    def __init__(self, on_error: OnError):
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={on_error!r}; use 'raise' or 'skip'")
        self.on_error = on_error
        self.skipped = 0

    def __call__(self, message: str, *, path: str | None, line: int | None = None) -> None:
        """Report one bad record; returns only in "skip" mode (the caller then drops it)."""
        error = SourceError(message, path=path, line=line)
        if self.on_error == "raise":
            raise error
        self.skipped += 1
        if self.skipped <= _MAX_LOGGED:
            _log.warning("skipped bad record: %s", error)
