"""SIGTERM and SIGINT: stop at once during start-up, save and stop at a step boundary after.

Schedulers send SIGTERM some seconds before they kill a job; a person presses Ctrl-C. Before
the first step there is nothing to save, so the handler raises `Stopped` straight away and the
command exits with `128 + signal` (143 for SIGTERM, 130 for SIGINT, the statuses a shell reports
for a process those signals killed) saying that nothing was saved. Once the loop runs, saving from
inside a signal handler would be unsafe (arrays may be mid-update), so the handler only records
the signal; the loop saves a checkpoint after the current step and returns early. A second
signal while that save runs stops at once.

`jaxstack-train` installs the handler as its very first action, before JAX is imported, so a
signal during the seconds of start-up is answered too.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
    """The shell's status for a process stopped by `signum`: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + signum


class Stopped(BaseException):
    """Raised by the handler when a stop signal arrives with nothing to save yet.

    A BaseException, like KeyboardInterrupt, so `except Exception` blocks do not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.detail: str | None = None  # where the run was and what it kept, set by the loop


class StopSignals:
    """Catches SIGTERM and SIGINT; `deferred` says whether to raise `Stopped` or only record."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferred = False
        self._previous: dict[int, Any] = {}

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def install(self) -> bool:
        """Replaces the handlers (main thread only); False where that is not possible."""
        if self._previous:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        self.signum, self.deferred = None, False
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if not isinstance(sys.unraisablehook, _QuietStopped):
            sys.unraisablehook = _QuietStopped(sys.unraisablehook)
        return True

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def agreed(self) -> bool:
        """Whether any process of the run was asked to stop; every process must call it at the
        same step. Saving is collective: a process that saved and left alone while the others
        went on to the next step would leave them all waiting for each other. A signal one
        process received is adopted by the rest, so all stop (and save) at the same step.

        Also true for a signal whose `Stopped` Python swallowed: a handler that runs inside a
        finalizer or weakref callback (importlib's module locks during JAX's import) cannot
        propagate, so the loop asks here where start-up ends."""
        import jax  # not at module level: the CLI installs the handler before JAX loads
        import numpy as np
        from jax.experimental import multihost_utils

        if jax.process_count() == 1:
            return self.requested
        # The answer is what was gathered, never this process's flag read again afterwards: a
        # signal landing between the all-gather and that read would stop this process alone.
        # Such a signal is in the next step's all-gather, for every process at once.
        agreed = int(np.max(multihost_utils.process_allgather(np.int32(self.signum or 0))))
        if agreed and self.signum is None:
            self.signum = agreed
        return bool(agreed)

    def _handle(self, signum: int, frame: Any) -> None:
        again = self.signum is not None
        self.signum = signum
        if again or not self.deferred:
            raise Stopped(signum)


class _QuietStopped:
    """`sys.unraisablehook` that drops a swallowed `Stopped` (its signal is kept in `STOP` and
    raised again where start-up ends) instead of printing a traceback."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, Stopped):
            self.previous(unraisable)


# The process-wide handler: the CLI installs it first thing; `train()` reuses it.
STOP = StopSignals()
