"""quantlib's errors: one base class, so callers can catch everything quantlib raises."""

from __future__ import annotations


class Error(Exception):
    """Base class of every quantlib error."""


class RuleError(Error, ValueError):
    """A quantisation rule that cannot be applied (unknown qtype, bad calibration, bad shape)."""


class SourceError(Error):
    """A run directory, checkpoint or quantised-model directory that cannot be loaded."""


class QuantWarning(UserWarning):
    """A rule that matched no module (the message lists the nearest module paths)."""
