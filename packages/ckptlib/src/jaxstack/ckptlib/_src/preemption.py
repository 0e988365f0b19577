"""Opt-in preemption handling: SIGTERM asks for a final checkpoint at the next step boundary.

Cloud schedulers send SIGTERM some seconds before they kill a job. Saving from inside a signal
handler is unsafe (arrays may be mid-update, the handler can run between any two bytecodes), so
the handler only sets a flag; the training loop asks `handler.reached_sync_point(step)` after
each step, and when it says so saves, waits, and exits.

    handler = PreemptionHandler().install()
    for step in range(start, total):
        state = train_step(state, batch)
        if handler.reached_sync_point(step):
            mgr.save(step, state, data_state=it.get_state()); mgr.wait()
            break

In a multi-process job the signal reaches the processes at different steps, or only one of
them, while saving is collective; `reached_sync_point` answers the same on every process (see
`multihost.agree_on_signal`), so they all save the same step.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from typing import Any

from jaxstack.ckptlib._src import multihost
from jaxstack.ckptlib._src.errors import CheckpointNotFoundError, Error


class PreemptionHandler:
    """Turns SIGTERM (or the given signals) into a flag the training loop polls.

    Args:
      signals: the signals to catch (default SIGTERM).

    `install()` replaces the signals' handlers (main thread only) and returns self;
    `uninstall()` puts the previous handlers back. It is also a context manager.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM,)) -> None:
        self._signals = tuple(signals)
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}
        self.received_signal: int | None = None

    @property
    def requested(self) -> bool:
        """True once a caught signal arrived (until `reset()`)."""
        return self._event.is_set()

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def reached_sync_point(self, step: int) -> bool:
        """Whether every process saves and stops after `step`: True on all of them as soon as
        any one has received a signal.

        Call it once per step on every process, after the same steps (in a multi-process job
        it is a collective, and processes at different steps raise an Error). A process that
        did not receive the signal adopts the one that arrived elsewhere: afterwards its
        `requested` and `received_signal` say so too.
        """
        signum = multihost.agree_on_signal(self.received_signal, step)
        if signum is not None and not self.requested:
            self.received_signal = signum
            self._event.set()
        return signum is not None

    def _handle(self, signum: int, frame: Any) -> None:
        self.received_signal = signum
        self._event.set()

    def install(self) -> PreemptionHandler:
        if self._previous:
            return self
        if threading.current_thread() is not threading.main_thread():
            raise Error("PreemptionHandler.install() must be called from the main thread")
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def reset(self) -> None:
        self._event.clear()
        self.received_signal = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a signal arrives (or timeout); returns `requested`."""
        return self._event.wait(timeout)

    def __enter__(self) -> PreemptionHandler:
        return self.install()

    def __exit__(self, *exc_info: Any) -> None:
        self.uninstall()


def resume(manager: Any, *, target: Any = None) -> Any:
    """The newest good checkpoint of `manager` restored into `target`, or None if there is none.

    Damaged newer checkpoints are skipped (with a warning) in favour of older good ones, so a
    job restarted after a crash or preemption continues from the last complete save.
    """
    manager.wait()
    if manager.latest_step() is None:
        return None
    try:
        return manager.restore(target=target)
    except CheckpointNotFoundError:
        return None
