"""Two JAX processes (jax.distributed over gloo on 127.0.0.1) train one data-parallel model with
datalib shards, nnlib, optlib and a ckptlib checkpoint written from both, and match one process
holding both shards on two devices: the same losses, and a checkpoint that restores to the
same parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from commands import environment, free_port

from jaxstack import ckptlib

SCRIPT = Path(__file__).parent / "scripts" / "data_parallel.py"
TIMEOUT_S = 300
pytestmark = pytest.mark.multiprocess


def launch(out: Path, process_id: int, count: int, port: int, devices: int) -> subprocess.Popen:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), str(process_id), str(count), str(port)],
        env=environment(XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(processes: list[subprocess.Popen]) -> list[str]:
    """Wait for every process; on a failure or timeout, stop the others too."""
    outputs = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=TIMEOUT_S)
            outputs.append(output)
            assert process.returncode == 0, output[-4000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return outputs


def two_processes(out: Path, attempts: int = 3) -> None:
    for attempt in range(attempts):
        port = free_port()
        try:
            finish([launch(out, i, 2, port, devices=1) for i in range(2)])
            return
        except AssertionError as error:
            # another program may take the port between the probe and the coordinator's bind
            if "address already in use" not in str(error).lower() or attempt + 1 == attempts:
                raise


def restored_params(directory: Path) -> list[np.ndarray]:
    with ckptlib.CheckpointManager(directory / "checkpoints", read_only=True) as manager:
        restored = manager.restore()
    return [np.asarray(leaf) for leaf in jax.tree.leaves(restored.state["params"])]


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_two_processes_train_as_one(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    finish([launch(single, 0, 1, 0, devices=2)])
    two_processes(multi)
    losses = {d.name: json.loads((d / "losses.json").read_text()) for d in (single, multi)}
    np.testing.assert_allclose(losses["multi"], losses["single"], rtol=1e-5)
    assert losses["single"][-1] < losses["single"][0]
    for a, b in zip(restored_params(single), restored_params(multi), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
