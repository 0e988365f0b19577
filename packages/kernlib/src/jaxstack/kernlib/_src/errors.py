"""The package's errors: one base class, so callers can catch everything kernlib raises."""

from __future__ import annotations


class Error(Exception):
    """Base class of every error raised by jaxstack.kernlib."""


class ConfigError(Error, ValueError):
    """Bad arguments or a bad block-size configuration (the message names the value and the fix)."""


class UnsupportedError(Error, NotImplementedError):
    """An implementation cannot run this configuration; `implementation=None` falls back to xla."""


class TuningCacheError(Error):
    """A tuning-cache file is unreadable or malformed."""
