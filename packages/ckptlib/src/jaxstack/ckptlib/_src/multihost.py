"""Process coordination: who writes shared files, and barriers safe in background threads."""

from __future__ import annotations

import jax
import numpy as np
from orbax.checkpoint import multihost as ocp_multihost

from jaxstack.ckptlib._src.errors import Error

_BARRIER_TIMEOUT_MS = 30 * 60 * 1000


def is_primary() -> bool:
    """Process 0 writes the files every process shares (JSON, manifest) and renames."""
    return jax.process_index() == 0


def barrier(key: str) -> None:
    """Wait until every JAX process reaches `key` (a no-op in a single process).

    Uses the distributed runtime's key-value barrier rather than a device collective, so it may
    run in the background commit thread while the training loop runs collectives of its own.
    """
    if jax.process_count() == 1:
        return
    ocp_multihost.get_barrier_sync_fn()(key=key, timeout_ms=_BARRIER_TIMEOUT_MS)


def agree_on_signal(signum: int | None, step: int) -> int | None:
    """The stop signal any process of the job received (the highest number), None if none did.

    A collective: every process calls it after the same `step`, each with what its own handler
    saw, and all get the same answer. That answer is the sync point: a preemption notice reaches
    the hosts of a job at different moments, and a process that saved and left on its own would
    leave the others waiting in the save's barriers, or in their next step, for ever. It is one
    all-gather of two int64 per call (JAX's `reached_preemption_sync_point`, MaxText's choice,
    needs the preemption service of `jax.distributed` and takes SIGTERM over in C++).

    Raises:
      Error: the processes called it after different steps (their loops are out of step).
    """
    if jax.process_count() == 1:
        return signum
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.array([signum or 0, step], np.int64))
    steps = sorted({int(s) for s in gathered[:, 1]})
    if len(steps) > 1:
        raise Error(
            f"processes reached the preemption sync point after different steps {steps}; call "
            "it once per step on every process, after the same steps"
        )
    return int(gathered[:, 0].max()) or None
