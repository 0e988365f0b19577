"""Writing one step at a time: Orbax's (a)synchronous array write, then the commit, in order.

`StepWriter.start` hands the arrays to Orbax and returns (async: once they are on the host);
a background thread waits for Orbax's writes and then runs the commit. `wait` joins it and
turns a failure into one `CheckpointSaveError` line; what Orbax logged about it goes to the
checkpoint directory's `save-errors.log`, not the console.

Exit with a save in flight: since Python 3.12 no thread can be started once the interpreter
begins to exit, and Orbax's writer thread (non-daemon, so joined at exit) starts threads to
finish a save (asyncio's executor, TensorStore callbacks). Left alone it failed with "can't
create new thread at interpreter shutdown", and once hung waiting for a thread that was never
started. So a `threading._register_atexit` hook, which runs before non-daemon threads are joined,
abandons a save still in flight: it cancels Orbax's background work (its futures), makes sure
the step is not committed, and says so in one line. The temporary directory is removed on the
next start; a save that is committed already stays as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from jaxstack.ckptlib._src import layout, multihost, orbax_log
from jaxstack.ckptlib._src.errors import CheckpointSaveError

_log = logging.getLogger("jaxstack.ckptlib")


@dataclasses.dataclass
class _Pending:
    step: int
    tmp: Path
    capture: orbax_log.Capture
    thread: threading.Thread | None = None
    error: BaseException | None = None
    phase: str = "writing the arrays"
    abandoned: bool = False


def _reason(error: BaseException) -> str:
    """The short cause of a failed write (TensorStore reports the OS error code in its text)."""
    text = str(error)
    code = re.search(r"os_error_code='?(\d+)", text)
    if code:
        return os.strerror(int(code.group(1)))
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    first = text.splitlines()[0] if text else ""
    first = first if len(first) <= 200 else first[:200] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class StepWriter:
    """Orbax's checkpointer plus the one save in flight for a `CheckpointManager`.

    Args:
      directory: the checkpoint directory (for messages and the error log).
      async_save: write in a background thread.
      latest_step: the newest good step, named in failure messages.
    """

    def __init__(
        self, directory: Path, *, async_save: bool, latest_step: Callable[[], int | None]
    ) -> None:
        self._directory = directory
        self._async = async_save
        self._latest_step = latest_step
        handler = ocp.PyTreeCheckpointHandler()
        self._checkpointer = (
            ocp.AsyncCheckpointer(handler) if async_save else ocp.Checkpointer(handler)
        )
        self._pending: _Pending | None = None
        if async_save:
            _register_for_exit(self)

    def start(self, step: int, tmp: Path, orbax_tree: Any, commit: Callable[[], None]) -> None:
        """Write `orbax_tree` into `tmp/state`, then call `commit` (in the background if async)."""
        pending = _Pending(step, tmp, orbax_log.Capture().start())
        self._pending = pending
        try:
            self._checkpointer.save(tmp / layout.STATE_DIR, args=ocp.args.PyTreeSave(orbax_tree))
        except BaseException as e:
            pending.error = e
            self.wait()
        if self._async:
            pending.thread = threading.Thread(
                target=self._finish, args=(pending, commit), daemon=True, name="ckptlib-commit"
            )
            pending.thread.start()
        else:
            self._finish(pending, commit)
            self.wait()

    def _finish(self, pending: _Pending, commit: Callable[[], None]) -> None:
        try:
            if self._async:
                self._checkpointer.wait_until_finished()
            if pending.abandoned:  # the process exits: cancelled writes are not a checkpoint
                return
            pending.phase = "committing"
            commit()
        except BaseException as e:  # reported by wait(); the step stays uncommitted
            pending.error = e

    def wait(self) -> None:
        """Block until the pending save is committed; raise CheckpointSaveError if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.thread is not None:
            pending.thread.join()
        pending.capture.stop()
        if pending.error is None:
            return
        if multihost.is_primary():
            layout.remove_tree_quietly(pending.tmp)  # else the next start removes it
        log = orbax_log.write_error_log(
            self._directory / layout.ERROR_LOG,
            f"saving step {pending.step} failed while {pending.phase}",
            pending.capture,
            pending.error,
        )
        latest = self._latest_step()
        still = f"step {latest}" if latest is not None else "none (there is no earlier one)"
        raise CheckpointSaveError(
            f"saving step {pending.step} to {self._directory} failed while {pending.phase} "
            f"({_reason(pending.error)}) and was not committed; the latest checkpoint is still "
            f"{still}; details in {log}"
        ) from None

    def join(self) -> None:
        """Wait for the pending save to finish, keeping its outcome for `wait`."""
        pending = self._pending
        if pending is not None and pending.thread is not None:
            pending.thread.join()

    @property
    def pending_step(self) -> int | None:
        return self._pending.step if self._pending is not None else None

    def abandon_at_exit(self) -> None:
        """At interpreter exit: cancel a save in flight (it cannot finish) and say so."""
        pending = self._pending
        if pending is None:
            return
        if pending.thread is None or not pending.thread.is_alive():
            try:
                self.wait()
            except CheckpointSaveError as e:
                _log.error("%s", e)
            return
        pending.abandoned = True
        cancel = getattr(self._checkpointer, "cancel", None)
        if cancel is not None:
            cancel()
            # Cancelled Orbax coroutines are dropped at teardown, and TensorStore may still try
            # to wake their closed event loop: not news after this warning.
            warnings.filterwarnings(
                "ignore", message="coroutine .* was never awaited", category=RuntimeWarning
            )
            sys.excepthook = functools.partial(_quiet_about_closed_loops, sys.excepthook)
            threading.excepthook = functools.partial(_quiet_thread, threading.excepthook)
        _log.warning(
            "the process exits while step %d is still being saved to %s: that step is not "
            "committed (no thread can start during interpreter exit, and a save needs some). "
            "Call wait() or close() (or use `with CheckpointManager(...)`) before exit.",
            pending.step,
            self._directory,
        )

    def close(self) -> None:
        """Wait (raising a failure) and release Orbax's checkpointer."""
        try:
            self.wait()
        finally:
            self._checkpointer.close()


def _closed_loop_noise(kind: type[BaseException], error: BaseException, tb: Any) -> bool:
    """ "Event loop is closed" raised inside asyncio: what cancelled Orbax coroutines leave."""
    if kind is not RuntimeError or str(error) != "Event loop is closed":
        return False
    frames = traceback.extract_tb(tb)
    return bool(frames) and os.path.basename(os.path.dirname(frames[-1].filename)) == "asyncio"


def _quiet_about_closed_loops(
    excepthook: Callable[..., Any], kind: type[BaseException], error: BaseException, tb: Any
) -> None:
    """sys.excepthook at exit after a cancel: drops the closed-loop noise."""
    if not _closed_loop_noise(kind, error, tb):
        excepthook(kind, error, tb)


def _quiet_thread(excepthook: Callable[..., Any], args: Any) -> None:
    """threading.excepthook at exit after a cancel: the same, for an Orbax or asyncio thread
    that meets the closed loop (seen once in CI on a loaded machine)."""
    if not _closed_loop_noise(args.exc_type, args.exc_value, args.exc_traceback):
        excepthook(args)


_writers: weakref.WeakSet[StepWriter] = weakref.WeakSet()
_hook_registered = False


def _register_for_exit(writer: StepWriter) -> None:
    global _hook_registered
    _writers.add(writer)
    if not _hook_registered:
        # Private to CPython, but the only hook that runs before Orbax's thread is joined.
        threading._register_atexit(_abandon_saves_at_exit)  # type: ignore[attr-defined]
        _hook_registered = True


def _abandon_saves_at_exit() -> None:
    for writer in list(_writers):
        writer.abandon_at_exit()
