"""The trainer's one error family: every message names the bad value and the fix."""


class Error(Exception):
    """Base class of every error jaxstack.trainer raises on purpose."""


class ConfigError(Error, ValueError):
    """A configuration value, key, preset or override is wrong."""


class MeshError(Error, ValueError):
    """The mesh does not fit the devices, or the batch does not divide over it."""


class DataError(Error, FileNotFoundError):
    """The training data cannot be found or read."""


class ResumeError(Error, ValueError):
    """The run directory's checkpoints cannot continue this config (e.g. already past it)."""
