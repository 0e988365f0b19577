"""CheckpointManager: all-or-nothing, asynchronous, verified checkpoints of a training run.

One `save(step, state, data_state=..., metadata=...)` writes one consistent snapshot:

1. (caller's thread) the state's arrays are handed to Orbax, which copies them to host memory
   and returns; NumPy leaves are copied; the JSON parts are validated and written
   (snapshot.py, commit.py). The training loop continues from here.
2. (background thread, writer.py) Orbax/TensorStore write the arrays (each process its own
   shards) into `.tmp-step_N/state`; then process 0 hashes every file, writes `manifest.json`,
   fsyncs and renames `.tmp-step_N` to `step_N` (commit.py). That rename is the commit point;
   retention runs after it (retention.py).

Everything that reads (`latest_step`, `all_steps`, `restore`) only ever looks at renamed
directories whose manifest checks out, so an uncommitted, cancelled, failed or killed save is
never reported, and its temporary directory is removed on the next start. A committed step that
fails its check is moved to `damaged/` (damage.py), so the run can save that step again.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxstack.ckptlib._src import commit, damage, layout, manifest, multihost, restore, snapshot
from jaxstack.ckptlib._src.damage import (
    CheckpointDamagedWarning,
    CheckpointFallbackWarning,
    DamagedCheckpoint,
)
from jaxstack.ckptlib._src.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    Error,
)
from jaxstack.ckptlib._src.manifest import VerificationResult
from jaxstack.ckptlib._src.retention import RetentionPolicy, delete_dropped
from jaxstack.ckptlib._src.writer import StepWriter


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `CheckpointManager.restore` returns.

    Attributes:
      step: the restored step.
      state: the state PyTree (the target's structure and shardings when a target was given).
      data_state: the data iterator's JSON state saved with it (None if none was saved); in a
        multi-process run, the one this process saved.
      metadata: the JSON metadata saved with it (None if none was saved).
    """

    step: int
    state: Any
    data_state: Any
    metadata: Any


class CheckpointManager:
    """Saves and restores training state in `directory`, one subdirectory per step.

    Args:
      directory: where checkpoints live (created if missing unless `create=False`).
      max_to_keep: keep the newest N good checkpoints (None: no limit from this rule).
      keep_every_n_steps: also keep every step divisible by this.
      best_n: also keep the N best steps by `metrics[best_metric]` passed to `save`.
      best_metric: the metric name `best_n` ranks by.
      best_mode: "min" (e.g. loss) or "max" (e.g. accuracy).
      async_save: write in the background; `save` returns once arrays are on the host.
      create: create `directory` if it does not exist (otherwise a missing one is an error).
      verify_on_restore: recompute content hashes before restoring (and fall back to the previous
        good checkpoint if they do not match).
      read_only: only read (no clean-up, nothing moved, `save` refused): safe to open a
        directory that a running job is writing to.

    Attributes:
      damaged: the steps this manager moved to `<directory>/damaged/` because they failed their
        check (on opening: missing or truncated files; in `restore`: changed bytes too). Each
        move is also reported by a CheckpointDamagedWarning or CheckpointFallbackWarning.
      removed_tmp_dirs: leftovers of unfinished saves removed on opening.

    Example:
      >>> with CheckpointManager("/tmp/run/ckpt", max_to_keep=3) as mgr:  # doctest: +SKIP
      ...     mgr.save(100, {"params": params, "opt_state": opt_state, "step": 100},
      ...              data_state=it.get_state(), metadata={"config": cfg})
      ...     restored = mgr.restore(target=abstract_state)
    """

    _instances = 0

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_to_keep: int | None = None,
        keep_every_n_steps: int | None = None,
        best_n: int | None = None,
        best_metric: str | None = None,
        best_mode: str = "min",
        async_save: bool = True,
        create: bool = True,
        verify_on_restore: bool = True,
        read_only: bool = False,
    ) -> None:
        self._directory = Path(os.fspath(directory)).absolute()
        self._policy = RetentionPolicy(
            max_to_keep, keep_every_n_steps, best_n, best_metric, best_mode
        )
        self._verify_on_restore = verify_on_restore
        self._read_only = read_only
        self._bad: dict[int, VerificationResult] = {}
        self._save_count = 0
        self._closed = False
        # Barrier names must never repeat; every process creates its managers in the same order.
        CheckpointManager._instances += 1
        self._barrier_prefix = (
            f"jaxstack_ckptlib.{zlib.crc32(str(self._directory).encode()):08x}"
            f".{CheckpointManager._instances}"
        )
        if not self._directory.is_dir():
            if not create or read_only:
                raise CheckpointNotFoundError(
                    f"checkpoint directory {self._directory} does not exist; check the path or "
                    "pass create=True"
                )
            if multihost.is_primary():
                self._directory.mkdir(parents=True, exist_ok=True)
        self.removed_tmp_dirs: list[Path] = []
        self.damaged: list[DamagedCheckpoint] = []
        if not read_only:
            self._clean_up()
            multihost.barrier(f"{self._barrier_prefix}.init")
        self._writer = StepWriter(
            self._directory, async_save=async_save, latest_step=self._newest_good_step
        )

    def _clean_up(self) -> None:
        """Remove what unfinished saves left; move damaged steps aside, saying so."""
        if not multihost.is_primary():
            return
        for leftover in layout.leftover_tmp_dirs(self._directory):
            layout.remove_tree(leftover)
            self.removed_tmp_dirs.append(leftover)
        for step in layout.committed_steps(self._directory):
            result = manifest.quick_check(layout.step_dir(self._directory, step))
            if not result.ok:
                self.damaged.append(damage.set_aside(self._directory, step, result))
        if self.damaged:
            message = damage.opening_message(
                self._directory, self.damaged, good_left=bool(self._good_steps())
            )
            warnings.warn(message, CheckpointDamagedWarning, stacklevel=3)

    @property
    def directory(self) -> Path:
        return self._directory

    # ----------------------------------------------------------------------------------- save

    def save(
        self,
        step: int,
        state: Any,
        *,
        data_state: Any = None,
        metadata: Any = None,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """Start an all-or-nothing checkpoint of `state` (plus JSON `data_state`, `metadata`).

        Args:
          step: the training step (a non-negative int not yet committed).
          state: a PyTree of jax/NumPy arrays and Python scalars.
          data_state: JSON state of this process's data iterator (in a multi-process run each
            process passes its own and gets its own back from `restore`).
          metadata: JSON metadata (config, ...), written by process 0.
          metrics: numbers for best-N retention, recorded in the manifest.

        Returns when the arrays are copied to host memory (async) or written (sync). A failure
        of the previous background save is raised here (as CheckpointSaveError) before anything
        new is started. A committed `step` that failed its check is moved aside first.

        Raises:
          CheckpointExistsError: a good checkpoint of `step` is already committed.
          CheckpointSaveError: this save (sync) or the previous one (async) failed: one line
            with the cause; Orbax's detail is in `<directory>/save-errors.log`.
          Error: a leaf, data_state, metadata or metrics value that cannot be saved safely.
        """
        self._check_open()
        if self._read_only:
            raise Error(f"this CheckpointManager of {self._directory} is read-only; cannot save")
        self.wait()
        if not isinstance(step, int | np.integer) or isinstance(step, bool) or step < 0:
            raise Error(f"step={step!r}: use a non-negative int")
        step = int(step)
        self._make_room(step)
        snap = snapshot.take(step, state, data_state=data_state, metadata=metadata, metrics=metrics)
        self._save_count += 1
        key = f"{self._barrier_prefix}.{step}.{self._save_count}"
        tmp = commit.open_tmp(self._directory, step, snap, key)
        finish = functools.partial(
            commit.commit,
            self._directory,
            step,
            tmp,
            snap.header,
            key,
            before_rename=self._before_commit_hook,
            after_commit=self._apply_retention,
        )
        self._writer.start(step, tmp, snap.orbax_tree, finish)

    def _make_room(self, step: int) -> None:
        """Refuse to overwrite a good step; move a damaged one aside."""
        path = layout.step_dir(self._directory, step)
        if not path.exists():
            return
        result = self._bad.get(step) or manifest.quick_check(path)
        if result.ok:
            raise CheckpointExistsError(
                f"a checkpoint of step {step} already exists in {self._directory}; save a new "
                "step or delete that one first"
            )
        # Only process 0 moves it; the others pass the commit's barriers after the move.
        self._set_aside(step, result)

    def _set_aside(self, step: int, result: VerificationResult) -> DamagedCheckpoint | None:
        self._bad.pop(step, None)
        if self._read_only or not multihost.is_primary():
            self._bad[step] = result
            return None
        moved = damage.set_aside(self._directory, step, result)
        self.damaged.append(moved)
        return moved

    # Fault injection for tests: called in the commit thread just before the commit rename.
    _before_commit_hook: Any = None

    def _apply_retention(self) -> None:
        delete_dropped(self._directory, self._good_steps(), self._policy)

    def wait(self) -> None:
        """Block until the pending save is committed; raise CheckpointSaveError if it failed."""
        self._writer.wait()

    # ---------------------------------------------------------------------------------- query

    def _good_steps(self) -> list[int]:
        return [
            s
            for s in layout.committed_steps(self._directory)
            if s not in self._bad and manifest.quick_check(layout.step_dir(self._directory, s)).ok
        ]

    def _newest_good_step(self) -> int | None:
        steps = self._good_steps()
        return steps[-1] if steps else None

    def all_steps(self) -> list[int]:
        """Committed steps whose manifest and file sizes check out, ascending.

        Steps that failed a full verification in this process (restore/verify) are left out too.
        """
        return self._good_steps()

    def latest_step(self) -> int | None:
        """The newest committed, checked step, or None. Never a step still being written."""
        return self._newest_good_step()

    def verify(self, step: int | None = None) -> VerificationResult:
        """Recompute the content hashes of `step` (default: the newest committed directory)."""
        self._writer.join()
        if step is None:
            steps = layout.committed_steps(self._directory)
            if not steps:
                raise CheckpointNotFoundError(f"no checkpoints in {self._directory}")
            step = steps[-1]
        result = manifest.verify(self._existing_step_dir(step))
        if result.ok:
            self._bad.pop(step, None)
        else:
            self._bad[step] = result
        return result

    def _existing_step_dir(self, step: int) -> Path:
        path = layout.step_dir(self._directory, step)
        if path.is_dir():
            return path
        moved = [d for d in self.damaged if d.step == step]
        if moved:
            raise CorruptCheckpointError(
                f"checkpoint of step {step} was damaged ({', '.join(moved[-1].problems)}) and "
                f"moved to {moved[-1].moved_to}; restore another step"
            )
        raise CheckpointNotFoundError(
            f"no checkpoint of step {step} in {self._directory}; good steps there: "
            f"{self.all_steps() or 'none'}"
        )

    # -------------------------------------------------------------------------------- restore

    def restore(
        self,
        step: int | None = None,
        *,
        target: Any = None,
        subtree: str | None = None,
        verify: bool | None = None,
    ) -> Restored:
        """Restore `step` (default: the newest good one) into `target`'s structure and shardings.

        Args:
          step: the step to restore; None picks the newest committed step that checks out,
            moving newer damaged ones aside (with a CheckpointFallbackWarning naming them).
          target: a PyTree of jax.Array / jax.ShapeDtypeStruct (with `.sharding`) / numpy arrays /
            Python scalars. Arrays come back with its shardings (any mesh, not just the saved
            one) and dtypes, in its exact structure. None rebuilds the saved structure (dicts,
            lists, tuples, NamedTuples such as optax states) with arrays on one local device.
          subtree: restore only the leaves under this `/`-path (e.g. "params"); `target` then
            describes that subtree.
          verify: recompute content hashes first (default: the manager's `verify_on_restore`).

        Raises:
          CheckpointNotFoundError: no such step, or no good checkpoint at all.
          CorruptCheckpointError: the requested `step` fails verification.
          TargetMismatchError: `target` has different paths or shapes (the first few are named).
        """
        self._check_open()
        self._writer.join()
        verify = self._verify_on_restore if verify is None else verify
        check = manifest.verify if verify else manifest.quick_check
        if step is not None:
            path = self._existing_step_dir(int(step))
            result = check(path)
            if not result.ok:
                self._bad[int(step)] = result
                raise CorruptCheckpointError(
                    f"checkpoint {path} is damaged: {'; '.join(result.problems)}. Restore "
                    "another step (step=None picks the newest good one)."
                )
            return self._load(int(step), target, subtree)
        skipped: list[str] = []
        for s in reversed(layout.committed_steps(self._directory)):
            result = self._bad.get(s) or check(layout.step_dir(self._directory, s))
            if result.ok:
                if skipped:
                    warnings.warn(
                        f"restoring step {s}: skipped damaged newer checkpoint(s) "
                        + "; ".join(skipped),
                        CheckpointFallbackWarning,
                        stacklevel=2,
                    )
                return self._load(s, target, subtree)
            skipped.append(self._describe_set_aside(s, result))
        detail = f"; damaged: {'; '.join(skipped)}" if skipped else ""
        raise CheckpointNotFoundError(f"no good checkpoint in {self._directory}{detail}")

    def _describe_set_aside(self, step: int, result: VerificationResult) -> str:
        moved = self._set_aside(step, result)
        where = f", moved to {moved.moved_to}" if moved is not None else ""
        return f"{layout.step_name(step)}: {', '.join(result.problems)}{where}"

    def _load(self, step: int, target: Any, subtree: str | None) -> Restored:
        path = layout.step_dir(self._directory, step)
        return Restored(
            step=step,
            state=restore.load_step(path, target, subtree),
            data_state=_read_optional(path / layout.data_state_file(jax.process_index())),
            metadata=_read_optional(path / layout.METADATA_FILE),
        )

    # ------------------------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise Error("this CheckpointManager is closed; create a new one")

    def close(self) -> None:
        """Wait for the pending save (raising its error, if any) and release resources."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self._directory)!r}, policy={self._policy})"


def _read_optional(path: Path) -> Any:
    return layout.read_json(path) if path.exists() else None
