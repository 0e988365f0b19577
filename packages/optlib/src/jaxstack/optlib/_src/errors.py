"""The one error family of optlib, and the warning for path regexes that select nothing."""

from __future__ import annotations


class Error(Exception):
    """Base class of every error optlib raises on purpose."""


class ConfigError(Error, ValueError):
    """A bad optimiser, schedule or loss setting; the message names the field and the fix."""


class UnmatchedRegexWarning(UserWarning):
    """A path regex in a config matched no parameter: almost always a typo in the config."""
