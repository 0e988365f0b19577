"""CheckpointManager: all-or-nothing, asynchronous, verified checkpoints of a training run.

One `save(step, state, data_state=..., metadata=...)` writes one consistent snapshot:

1. (caller's thread) the state's arrays are handed to Orbax, which copies them to host memory
   and returns; NumPy leaves are copied; the JSON parts are validated and written. The training
   loop continues from here.
2. (background thread) Orbax/TensorStore write the arrays (each process its own shards) into
   `.tmp-step_N/state`; then process 0 hashes every file, writes `manifest.json`, fsyncs and
   renames `.tmp-step_N` to `step_N`. That rename is the commit point; retention runs after it.

Everything that reads (`latest_step`, `all_steps`, `restore`) only ever looks at renamed
directories whose manifest checks out, so an uncommitted, cancelled, failed or killed save is
never reported, and its temporary directory is removed on the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import os
import threading
import time
import warnings
import weakref
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxstack.ckptlib._src import layout, manifest, multihost, restore, retention, tree
from jaxstack.ckptlib._src.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CheckpointSaveError,
    CorruptCheckpointError,
    Error,
)
from jaxstack.ckptlib._src.manifest import VerificationResult
from jaxstack.ckptlib._src.versions import package_versions


class CheckpointFallbackWarning(UserWarning):
    """restore() skipped a newer checkpoint that failed verification and used an older one."""


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


@dataclasses.dataclass
class _PendingSave:
    step: int
    thread: threading.Thread | None = None
    error: BaseException | None = None


def _json_snapshot(value: Any, name: str) -> Any:
    """A deep copy through JSON, so later mutation by the caller cannot change the checkpoint."""
    if value is None:
        return None
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise Error(
            f"{name} must be JSON-serialisable (dicts, lists, str, int, finite float, bool, None); "
            f"{e}. Convert arrays with .tolist() and objects to dicts before saving."
        ) from e


def _snapshot_leaf(path: tree.Path, leaf: Any) -> Any:
    leaf = tree.storage_form(leaf)
    if isinstance(leaf, jax.Array):
        return leaf  # immutable; Orbax copies it to host before save() returns
    if isinstance(leaf, np.ndarray | np.generic):
        return np.array(leaf, copy=True)
    if isinstance(leaf, bool | int | float):
        return np.asarray(leaf)
    raise Error(
        f"leaf {tree.path_str(path)!r} has type {type(leaf).__name__}; a checkpointed state may "
        "hold jax/numpy arrays and Python scalars only (no pickled objects)"
    )


def _warn_at_exit(manager_ref: weakref.ref) -> None:
    """Say so when a process exits with a save in flight (it cannot finish during shutdown)."""
    manager = manager_ref()
    pending = manager._pending if manager is not None else None
    if pending is not None and pending.thread is not None and pending.thread.is_alive():
        logging.getLogger(__name__).warning(
            "the process exits while step %d is still being saved to %s: that step will not be "
            "committed. Call wait() or close() (or use `with CheckpointManager(...)`) before exit.",
            pending.step,
            manager.directory,
        )


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
      read_only: only read (no tmp-dir cleanup, `save` refused): safe to open a directory that
        a running job is writing to.

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
        self._policy = retention.RetentionPolicy(
            max_to_keep, keep_every_n_steps, best_n, best_metric, best_mode
        )
        self._async = async_save
        self._verify_on_restore = verify_on_restore
        self._pending: _PendingSave | None = None
        self._bad: dict[int, VerificationResult] = {}
        self._save_count = 0
        self._closed = False
        self._exit_hook_registered = False
        # Barrier names must never repeat; every process creates its managers in the same order.
        CheckpointManager._instances += 1
        self._barrier_prefix = (
            f"jaxstack_ckptlib.{zlib.crc32(str(self._directory).encode()):08x}"
            f".{CheckpointManager._instances}"
        )
        self._read_only = read_only
        if not self._directory.is_dir():
            if not create or read_only:
                raise CheckpointNotFoundError(
                    f"checkpoint directory {self._directory} does not exist; check the path or "
                    "pass create=True"
                )
            if multihost.is_primary():
                self._directory.mkdir(parents=True, exist_ok=True)
        self.removed_tmp_dirs: list[Path] = []
        if multihost.is_primary() and not read_only:
            for leftover in layout.leftover_tmp_dirs(self._directory):
                layout.remove_tree(leftover)
                self.removed_tmp_dirs.append(leftover)
        if not read_only:
            multihost.barrier(f"{self._barrier_prefix}.init")
        handler = ocp.PyTreeCheckpointHandler()
        self._checkpointer = (
            ocp.AsyncCheckpointer(handler) if async_save else ocp.Checkpointer(handler)
        )

    # ----------------------------------------------------------------------------------- save

    @property
    def directory(self) -> Path:
        return self._directory

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
        new is started.

        Raises:
          CheckpointExistsError: step `step` is already committed.
          CheckpointSaveError: the previous asynchronous save failed.
          Error: a leaf, data_state, metadata or metrics value that cannot be saved safely.
        """
        self._check_open()
        if self._read_only:
            raise Error(f"this CheckpointManager of {self._directory} is read-only; cannot save")
        self.wait()
        if not isinstance(step, int | np.integer) or isinstance(step, bool) or step < 0:
            raise Error(f"step={step!r}: use a non-negative int")
        step = int(step)
        if layout.step_dir(self._directory, step).exists():
            raise CheckpointExistsError(
                f"a checkpoint of step {step} already exists in {self._directory}; save a new "
                "step or delete that one first"
            )
        data_state = _json_snapshot(data_state, "data_state")
        metadata = _json_snapshot(metadata, "metadata")
        metrics = self._check_metrics(metrics)
        paths, leaves, treedef = tree.flatten(state)
        if not leaves:
            raise Error("state has no array leaves; there is nothing to checkpoint")
        header = {
            "step": step,
            "created_unix": time.time(),
            "process_count": jax.process_count(),
            "versions": package_versions(),
            "metrics": metrics,
            "tree": tree.describe(state),
            "leaves": [
                {
                    "path": list(p),
                    "shape": list(np.shape(stored)),
                    "dtype": np.dtype(
                        stored.dtype if hasattr(stored, "dtype") else np.asarray(stored).dtype
                    ).name,
                    "kind": tree.leaf_kind(leaf),
                }
                for p, leaf in zip(paths, leaves, strict=True)
                for stored in [tree.storage_form(leaf)]
            ],
            "has_data_state": data_state is not None,
            "has_metadata": metadata is not None,
        }
        copies = [_snapshot_leaf(p, x) for p, x in zip(paths, leaves, strict=True)]
        # Orbax gets the state's own structure, so plain Orbax restores it with the usual
        # abstract target (it writes NamedTuples as dicts and tuples as lists).
        orbax_tree = jax.tree_util.tree_unflatten(treedef, copies)

        self._save_count += 1
        key = f"{self._barrier_prefix}.{step}.{self._save_count}"
        tmp = layout.tmp_dir(self._directory, step)
        if multihost.is_primary():
            layout.remove_tree(tmp)
            tmp.mkdir()
            if data_state is not None:
                layout.write_json(tmp / layout.data_state_file(0), data_state)
            if metadata is not None:
                layout.write_json(tmp / layout.METADATA_FILE, metadata)
        multihost.barrier(f"{key}.tmp")
        if jax.process_index() > 0 and data_state is not None:
            # Each process has its own data iterator (its own shard of the data).
            layout.write_json(tmp / layout.data_state_file(jax.process_index()), data_state)
        pending = _PendingSave(step)
        try:
            self._checkpointer.save(tmp / layout.STATE_DIR, args=ocp.args.PyTreeSave(orbax_tree))
        except BaseException as e:
            self._discard(tmp)
            raise CheckpointSaveError(f"saving step {step} failed before it started: {e}") from e
        if self._async:
            pending.thread = threading.Thread(
                target=self._finish, args=(pending, tmp, header, key), daemon=True
            )
            self._pending = pending
            pending.thread.start()
            if not self._exit_hook_registered:
                atexit.register(_warn_at_exit, weakref.ref(self))
                self._exit_hook_registered = True
        else:
            self._pending = pending
            self._finish(pending, tmp, header, key)
            self.wait()

    @staticmethod
    def _check_metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
        if metrics is None:
            return {}
        out = {}
        for name, value in metrics.items():
            try:
                out[str(name)] = float(value)
            except (TypeError, ValueError) as e:
                raise Error(f"metrics[{name!r}]={value!r} is not a number") from e
            if not math.isfinite(out[str(name)]):
                out[str(name)] = None  # JSON has no NaN; such a step never ranks as best
        return out

    # Fault injection for tests: called in the commit thread just before the commit rename.
    _before_commit_hook: Any = None

    def _finish(self, pending: _PendingSave, tmp: Path, header: dict[str, Any], key: str) -> None:
        """Wait for the array writes, then commit (process 0) and apply retention."""
        try:
            if self._async:
                self._checkpointer.wait_until_finished()
            multihost.barrier(f"{key}.written")
            if multihost.is_primary():
                layout.fsync_tree(tmp)
                record = manifest.build(tmp, header)
                layout.write_json(tmp / layout.MANIFEST_FILE, record)
                if self._before_commit_hook is not None:
                    self._before_commit_hook(pending.step)
                os.rename(tmp, layout.step_dir(self._directory, pending.step))
                layout.fsync_dir(self._directory)
                self._apply_retention()
            multihost.barrier(f"{key}.committed")
        except BaseException as e:  # reported by wait(); the step stays uncommitted
            pending.error = e
            self._discard(tmp)

    def _discard(self, tmp: Path) -> None:
        if multihost.is_primary():
            with contextlib.suppress(OSError):  # the next start removes it
                layout.remove_tree(tmp)

    def wait(self) -> None:
        """Block until the pending save is committed; raise CheckpointSaveError if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.thread is not None:
            pending.thread.join()
        if pending.error is not None:
            raise CheckpointSaveError(
                f"saving step {pending.step} to {self._directory} failed and was not committed "
                f"(the previous good checkpoint is still the latest): {pending.error!r}"
            ) from pending.error

    def _join_quietly(self) -> None:
        pending = self._pending
        if pending is not None and pending.thread is not None:
            pending.thread.join()

    def _apply_retention(self) -> None:
        """Delete what the policy drops; a failure here is logged, the new step stays committed."""
        try:
            self._delete_dropped_steps()
        except OSError as e:
            logging.getLogger(__name__).warning("retention in %s failed: %s", self._directory, e)

    def _delete_dropped_steps(self) -> None:
        good = self._good_steps()
        if not self._policy.deletes_anything:
            return
        metrics = {s: manifest.load(layout.step_dir(self._directory, s))["metrics"] for s in good}
        keep = retention.steps_to_keep(good, metrics, self._policy)
        for s in good:
            if s not in keep:
                layout.remove_tree(layout.step_dir(self._directory, s))

    # ---------------------------------------------------------------------------------- query

    def _good_steps(self) -> list[int]:
        good = []
        for s in layout.committed_steps(self._directory):
            if s in self._bad:
                continue
            if manifest.quick_check(layout.step_dir(self._directory, s)).ok:
                good.append(s)
        return good

    def all_steps(self) -> list[int]:
        """Committed steps whose manifest and file sizes check out, ascending.

        Steps that failed a full verification in this process (restore/verify) are left out too.
        """
        return self._good_steps()

    def latest_step(self) -> int | None:
        """The newest committed, checked step, or None. Never a step still being written."""
        steps = self._good_steps()
        return steps[-1] if steps else None

    def verify(self, step: int | None = None) -> VerificationResult:
        """Recompute the content hashes of `step` (default: the newest committed directory)."""
        self._join_quietly()
        if step is None:
            steps = layout.committed_steps(self._directory)
            if not steps:
                raise CheckpointNotFoundError(f"no checkpoints in {self._directory}")
            step = steps[-1]
        path = self._existing_step_dir(step)
        result = manifest.verify(path)
        if result.ok:
            self._bad.pop(step, None)
        else:
            self._bad[step] = result
        return result

    def _existing_step_dir(self, step: int) -> Path:
        path = layout.step_dir(self._directory, step)
        if not path.is_dir():
            raise CheckpointNotFoundError(
                f"no checkpoint of step {step} in {self._directory}; good steps there: "
                f"{self.all_steps() or 'none'}"
            )
        return path

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
          step: the step to restore; None picks the newest committed step that checks out and
            falls back to older ones (with a CheckpointFallbackWarning) past corrupt ones.
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
        self._join_quietly()
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
        steps = layout.committed_steps(self._directory)
        skipped: list[VerificationResult] = []
        for s in reversed(steps):
            if s in self._bad:
                skipped.append(self._bad[s])
                continue
            result = check(layout.step_dir(self._directory, s))
            if result.ok:
                if skipped:
                    warnings.warn(
                        f"restoring step {s}: skipped damaged newer checkpoint(s) "
                        + "; ".join(f"{r.path.name}: {', '.join(r.problems)}" for r in skipped),
                        CheckpointFallbackWarning,
                        stacklevel=2,
                    )
                return self._load(s, target, subtree)
            self._bad[s] = result
            skipped.append(result)
        detail = f"; damaged: {[r.path.name for r in skipped]}" if skipped else ""
        raise CheckpointNotFoundError(f"no good checkpoint in {self._directory}{detail}")

    def _load(self, step: int, target: Any, subtree: str | None) -> Restored:
        path = layout.step_dir(self._directory, step)
        record = manifest.load(path)
        saved = {
            tuple(leaf["path"]): restore.SavedLeaf(
                tuple(leaf["shape"]), leaf["dtype"], leaf["kind"]
            )
            for leaf in record["leaves"]
        }
        saved_tree, on_disk = restore.saved_leaves_from_orbax(path / layout.STATE_DIR)
        if set(on_disk) != set(saved):
            raise CorruptCheckpointError(
                f"{path}: the Orbax metadata and the manifest list different leaves"
            )
        prefix = tuple(subtree.strip("/").split("/")) if subtree else ()
        has_target = target is not None
        flat, treedef = restore.restore_leaves(
            path / layout.STATE_DIR,
            saved_tree,
            saved,
            target=target,
            has_target=has_target,
            prefix=prefix,
        )
        if has_target:
            t_paths, _, _ = tree.flatten(target)
            state = jax.tree_util.tree_unflatten(treedef, [flat[p] for p in t_paths])
        else:
            state = tree.rebuild(tree.subdescription(record["tree"], prefix), flat)
        return Restored(
            step=step,
            state=state,
            data_state=self._read_optional(path / layout.data_state_file(jax.process_index())),
            metadata=self._read_optional(path / layout.METADATA_FILE),
        )

    @staticmethod
    def _read_optional(path: Path) -> Any:
        return layout.read_json(path) if path.exists() else None

    # ------------------------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise Error("this CheckpointManager is closed; create a new one")

    def close(self) -> None:
        """Wait for the pending save (raising its error, if any) and release resources."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._checkpointer.close()
            self._pending = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self._directory)!r}, policy={self._policy})"
