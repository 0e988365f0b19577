"""The trainer's one error family: every message names the bad value and the fix."""

import contextlib
import sys
import warnings
from collections.abc import Iterator


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


def report_error(prog: str, error: Exception, ours: type[Exception] = Error) -> int:
    """How a command answers an error: one line on stderr and exit status 2 for an error the
    user can fix (one of `ours`, or a sibling jaxstack package's own, named by its type);
    anything else is a bug and is raised again."""
    if isinstance(error, ours):
        print(f"{prog}: error: {error}", file=sys.stderr)
    elif type(error).__module__.startswith("jaxstack."):
        print(f"{prog}: error: {type(error).__name__}: {error}", file=sys.stderr)
    else:
        raise error
    return 2


@contextlib.contextmanager
def report_warnings(prog: str) -> Iterator[None]:
    """How a command answers the warnings raised inside (a config's clamped warmup): each one
    line on stderr, `prog: warning: <message>`, instead of Python's file-and-line format."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        yield
    for warning in caught:
        print(f"{prog}: warning: {warning.message}", file=sys.stderr)
