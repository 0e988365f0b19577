"""Layouts on 8 CPU devices, two processes under jax.distributed, SIGKILL and resume.

Each test runs the trainer in fresh Python processes (device counts and jax.distributed are
fixed at backend start). All the processes of one test share one deadline that ends before
pytest's own timeout, so a hung process is killed by the test (with its siblings) and reported
with its output instead of being cut off by pytest.
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxstack.trainer import read_jsonl

SCRIPTS = pathlib.Path(__file__).parent / "scripts"
PYTEST_TIMEOUT_S = 900  # the CI's --timeout
pytestmark = pytest.mark.timeout(PYTEST_TIMEOUT_S)


@pytest.fixture
def deadline() -> float:
    """When every process of the test must be done: a minute before pytest's timeout."""
    return time.monotonic() + PYTEST_TIMEOUT_S - 60


def _left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


def _env(devices: int | None = None) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _run(args: list[str], env: dict[str, str], deadline: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=_left(deadline)
    )


def _layout_losses(root: pathlib.Path, devices: int, layouts: list[str], deadline: float) -> dict:
    script = str(SCRIPTS / "train_layouts.py")
    proc = _run([script, str(root), *layouts], _env(devices), deadline)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_layouts_on_8_devices_match_one_device(tmp_path, deadline):
    ref = _layout_losses(tmp_path / "one", 1, ["data=1"], deadline)["data=1"]
    layouts = ["data=8", "fsdp=8", "fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"]
    got = _layout_losses(tmp_path / "eight", 8, layouts, deadline)
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


def _two_processes(
    run_dir: pathlib.Path,
    steps: int,
    deadline: float,
    signal_after: int | None = None,
    mode: str | None = None,
) -> list[tuple[int, str]]:
    """(status, output) of both workers (`mode`: see the worker); with `signal_after`, SIGTERM
    goes to process 1 alone once both have printed that step (each is then somewhere in a later
    step, or saving). Another program may take the free port between `_free_port` and the
    coordinator's bind; then the pair is started again on a new port."""
    worker = str(SCRIPTS / "multihost_worker.py")
    logs = [run_dir.parent / f"{run_dir.name}.worker{i}.log" for i in range(2)]
    extra = ["report"] if signal_after is not None else [mode] if mode else []
    for _attempt in range(3):
        port = _free_port()
        procs = []
        for i, log in enumerate(logs):
            with open(log, "w") as out:  # the child keeps its own copy
                args = [worker, str(i), str(port), str(run_dir), str(steps), *extra]
                procs.append(
                    subprocess.Popen([sys.executable, *args], env=_env(), stdout=out, stderr=out)
                )
        try:
            if signal_after is not None:
                reached = f"STEP {signal_after}\n"
                while not all(reached in log.read_text() for log in logs):
                    if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                else:
                    procs[1].send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=_left(deadline))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:  # a timeout or a failed sibling must not leave the other running
                if p.poll() is None:
                    p.kill()
                p.wait()
        results = [(p.returncode, log.read_text()) for p, log in zip(procs, logs, strict=True)]
        if not any("address already in use" in out.lower() for _, out in results):
            return results
    return results


@pytest.mark.multiprocess
def test_two_processes_match_one_process(tmp_path, deadline):
    multi_dir = tmp_path / "multi"
    for status, out in _two_processes(multi_dir, 8, deadline):
        assert status == 0, out[-3000:]
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
        deadline,
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


@pytest.mark.multiprocess
def test_sigterm_to_one_process_stops_every_process_at_one_step_with_its_checkpoint(
    tmp_path, deadline
):
    # SIGTERM reaches process 1 alone, at whatever point of a step it is. Saving is collective:
    # if it saved and left while process 0 went on, both would wait for each other until killed.
    results = _two_processes(tmp_path / "run", 30, deadline, signal_after=2)
    stopped = []
    for i, (status, out) in enumerate(results):
        assert status == 143, out[-3000:]
        stopped += re.findall(rf"^PROCESS {i} STOPPED by SIGTERM at step (\d+)$", out, re.M)
    assert len(stopped) == 2 and stopped[0] == stopped[1], [out[-3000:] for _, out in results]
    step = int(stopped[0])
    assert step >= 3
    from jaxstack import ckptlib

    with ckptlib.CheckpointManager(tmp_path / "run" / "checkpoints", read_only=True) as m:
        assert m.latest_step() == step
        assert m.restore().step == step


@pytest.mark.multiprocess
def test_sigterm_to_one_process_during_start_up_stops_every_process_before_the_first_step(
    tmp_path, deadline
):
    # Before the first step there is nothing to save, but a process that left alone would
    # leave the other waiting in the first step boundary's agreement.
    results = _two_processes(tmp_path / "run", 30, deadline, mode="startup")
    for i, (status, out) in enumerate(results):
        assert status == 143, out[-3000:]
        assert f"PROCESS {i} STOPPED by SIGTERM during start-up" in out, out[-3000:]
        assert "STEP " not in out


def test_sigkill_then_resume_is_bitwise_identical(tmp_path, deadline):
    script = str(SCRIPTS / "kill_resume.py")
    straight = _run([script, str(tmp_path / "straight"), "12"], _env(), deadline)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run([script, str(tmp_path / "resumed"), "12", "7"], _env(), deadline)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "KILLING at step 7" in killed.stdout
    resumed = _run([script, str(tmp_path / "resumed"), "12"], _env(), deadline)
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
