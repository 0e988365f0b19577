"""Layouts on 8 CPU devices, two processes under jax.distributed, SIGKILL and resume.

Each test runs the trainer in fresh Python processes (device counts and jax.distributed are
fixed at backend start), so they are slow and marked as such.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxstack.trainer import read_jsonl

SCRIPTS = pathlib.Path(__file__).parent / "scripts"


def _env(devices: int | None = None) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _run(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _layout_losses(root: pathlib.Path, devices: int, layouts: list[str]) -> dict:
    proc = _run([str(SCRIPTS / "train_layouts.py"), str(root), *layouts], _env(devices))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_layouts_on_8_devices_match_one_device(tmp_path):
    ref = _layout_losses(tmp_path / "one", 1, ["data=1"])["data=1"]
    layouts = ["data=8", "fsdp=8", "fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"]
    got = _layout_losses(tmp_path / "eight", 8, layouts)
    assert ref["loss"][-1] < ref["loss"][0]
    for layout in layouts:
        np.testing.assert_allclose(got[layout]["loss"], ref["loss"], rtol=2e-5, err_msg=layout)
        np.testing.assert_allclose(
            got[layout]["grad_norm"], ref["grad_norm"], rtol=1e-4, err_msg=layout
        )
        assert got[layout]["eval_loss"] == pytest.approx(ref["eval_loss"], rel=2e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_two_processes_match_one_process(tmp_path):
    port = _free_port()
    worker = str(SCRIPTS / "multihost_worker.py")
    multi_dir = tmp_path / "multi"
    procs = [
        subprocess.Popen(
            [sys.executable, worker, str(i), str(port), str(multi_dir), "8"],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "DONE step 8" in out
    # The same global batches read by one process: data.num_shards=2 without jax.distributed.
    single_dir = tmp_path / "single"
    proc = _run(
        [
            "-m",
            "jaxstack.trainer._src.cli",
            "--config",
            "test",
            f"log.run_dir={single_dir}",
            "train.steps=8",
            "data.num_shards=2",
            "checkpoint.every=4",
            "eval.every=0",
            "log.sample_tokens=0",
            "train.xla_flags=null",  # the workers call train() directly, without CLI flags
        ],
        _env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    multi = [r for r in read_jsonl(multi_dir / "metrics.jsonl") if r["kind"] == "train"]
    single = [r for r in read_jsonl(single_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert len(multi) == len(single) == 8
    np.testing.assert_allclose([r["loss"] for r in multi], [r["loss"] for r in single], rtol=2e-5)
    # Both processes' checkpoints landed in one directory, and are the single run's numbers.
    from jaxstack import ckptlib

    with ckptlib.CheckpointManager(multi_dir / "checkpoints", read_only=True) as m:
        assert m.all_steps() == [4, 8]
        a = m.restore()
    with ckptlib.CheckpointManager(single_dir / "checkpoints", read_only=True) as m:
        b = m.restore()
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    script = str(SCRIPTS / "kill_resume.py")
    straight = _run([script, str(tmp_path / "straight"), "12"], _env())
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run([script, str(tmp_path / "resumed"), "12", "7"], _env())
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "KILLING at step 7" in killed.stdout
    resumed = _run([script, str(tmp_path / "resumed"), "12"], _env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from checkpoint step" in resumed.stdout

    from jaxstack import ckptlib

    def final(run: str):
        with ckptlib.CheckpointManager(tmp_path / run / "checkpoints", read_only=True) as m:
            return m.restore()

    a, b = final("straight"), final("resumed")
    assert a.step == b.step == 12
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y))
    assert a.data_state == b.data_state
    # the resumed run repeated the steps after its checkpoint with the very same losses
    ref = {
        r["step"]: r["loss"]
        for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl")
        if r["kind"] == "train"
    }
    after = [r for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl") if r["kind"] == "train"]
    assert all(ref[r["step"]] == r["loss"] for r in after)
