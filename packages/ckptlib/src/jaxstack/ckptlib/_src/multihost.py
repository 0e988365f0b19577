"""Process coordination: who writes shared files, and barriers safe in background threads."""

from __future__ import annotations

import jax
from orbax.checkpoint import multihost as ocp_multihost

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
