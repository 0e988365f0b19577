"""The package's errors: one base class, one subclass per thing a caller can act on."""

from __future__ import annotations


class Error(Exception):
    """Base class of every error jaxstack.ckptlib raises on purpose."""


class CheckpointNotFoundError(Error, FileNotFoundError):
    """The directory, the step, or any good checkpoint at all is missing."""


class CorruptCheckpointError(Error):
    """A checkpoint's files do not match its manifest (missing, truncated or changed bytes)."""


class TargetMismatchError(Error, ValueError):
    """A restore target's tree paths or shapes differ from what the checkpoint holds."""


class CheckpointSaveError(Error):
    """An (asynchronous) save failed; the step was not committed and its files were removed."""


class CheckpointExistsError(Error, FileExistsError):
    """A committed checkpoint of that step already exists."""
