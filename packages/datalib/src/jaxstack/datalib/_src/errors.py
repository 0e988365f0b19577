"""The one exception family of datalib: every failure a user can cause is an `Error`."""

from __future__ import annotations


class Error(Exception):
    """Base class of all datalib errors."""


class ConfigError(Error, ValueError):
    """An argument has a value datalib cannot work with (the message names it and the fix)."""


class SourceError(Error):
    """A source could not be read: an unreadable file or a malformed record.

    `path` and `line` (1-based; None when the whole file is at fault) say where, so a user can
    open the file at the bad record.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = "" if path is None else (f"{path}:{line}: " if line is not None else f"{path}: ")
        super().__init__(where + message)
        self.path = path
        self.line = line


class EmptySourceError(SourceError):
    """A source holds no documents at all; training on it would spin forever."""


class TokenizerError(Error):
    """A tokenizer file or chat template is missing, malformed or lacks a needed token."""


class StateError(Error):
    """An iterator state does not belong to this pipeline or is malformed."""
