"""The one error family of jaxstack.rl: every message names the bad value or record and the fix."""

from __future__ import annotations


class Error(Exception):
    """Base class of every error jaxstack.rl raises on purpose."""


class ConfigError(Error, ValueError):
    """A configuration value, key or combination is wrong."""


class RecordError(Error, ValueError):
    """A chat or preference record is malformed; `path` and `line` (1-based) say where."""

    def __init__(self, message: str, *, path: str, line: int):
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line


class RewardError(Error):
    """A reward function raised; the message names the function and the prompt."""
