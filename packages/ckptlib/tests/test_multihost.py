"""Two JAX processes on 127.0.0.1 (jax.distributed, gloo) write one checkpoint, each its shards."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from ckptlib_multihost_worker import global_values
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxstack.ckptlib import CheckpointManager

WORKER = Path(__file__).with_name("ckptlib_multihost_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_two_processes_save_their_shards_and_restore_resharded(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(i),
                str(port),
                str(tmp_path / "ckpt"),
                str(tmp_path / f"result{i}.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
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
