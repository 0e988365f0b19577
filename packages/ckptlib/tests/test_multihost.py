"""Two JAX processes on 127.0.0.1 (jax.distributed, gloo) write one checkpoint, each its shards."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from ckptlib_multihost_worker import global_values
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxstack.ckptlib import CheckpointManager

WORKER = Path(__file__).with_name("ckptlib_multihost_worker.py")


ATTEMPTS = 3
DEADLINE_S = 240  # for all attempts together; the pytest timeout below is longer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(tmp_path: Path, port: int) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    args = [str(port), str(tmp_path / "ckpt")]
    procs = []
    for i in range(2):
        with open(tmp_path / f"log{i}.txt", "w") as log:  # the child keeps its own copy
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), str(i), *args, str(tmp_path / f"result{i}.json")],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def wait_for_all_or_one_failure(procs: list[subprocess.Popen], deadline: float) -> None:
    """Return when every worker exited, or one failed (its sibling would wait for it forever)."""
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers did not finish within {DEADLINE_S} s")
        time.sleep(0.2)


def run_two_workers(tmp_path: Path) -> None:
    """Run the workers, with a new port when the coordinator lost its port to another process
    between `free_port` and its own bind (nothing can reserve it for jax.distributed)."""
    deadline = time.monotonic() + DEADLINE_S
    for attempt in range(ATTEMPTS):
        procs = start_workers(tmp_path, free_port())
        try:
            wait_for_all_or_one_failure(procs, deadline)
        finally:
            for p in procs:  # a sibling left waiting for a dead coordinator is killed
                if p.poll() is None:
                    p.kill()
                p.wait()
        if all(p.returncode == 0 for p in procs):
            return
        logs = [(tmp_path / f"log{i}.txt").read_text() for i in range(2)]
        if "already in use" not in logs[0].lower() or attempt == ATTEMPTS - 1:
            raise AssertionError("\n".join(log[-3000:] for log in logs))


@pytest.mark.multiprocess
@pytest.mark.timeout(DEADLINE_S + 60)
def test_two_processes_save_their_shards_and_restore_resharded(tmp_path):
    run_two_workers(tmp_path)
    results = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(2)]
    for i, result in enumerate(results):
        assert result["process_count"] == 2
        assert result["all_steps"] == [2]  # retention ran once, on process 0
        assert result["restored_step"] == 2
        assert result["data_state"] == {"process": i, "step": 2}  # each its own iterator
        assert result["shards_match"] and result["shard_shapes"] == [[16, 2], [16, 2]]
    # Each process wrote its own shards ...
    state_dir = tmp_path / "ckpt" / "step_00000002" / "state"
    assert (state_dir / "ocdbt.process_0").is_dir() and (state_dir / "ocdbt.process_1").is_dir()
    # ... and one process with another device count restores the whole thing.
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    target = {
        "params": {
            "w": jax.ShapeDtypeStruct(
                (16, 8), np.float32, sharding=NamedSharding(mesh, P("a", "b"))
            )
        },
        "step": 0,
    }
    with CheckpointManager(tmp_path / "ckpt") as mgr:
        assert mgr.verify(2).ok
        restored = mgr.restore(target=target)
    np.testing.assert_array_equal(restored.state["params"]["w"], global_values() * 2)
    assert restored.state["step"] == 2
