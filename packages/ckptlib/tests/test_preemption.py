import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_multihost import free_port

from jaxstack.ckptlib import CheckpointManager, PreemptionHandler, agree_on_signal, resume

WORKER = Path(__file__).with_name("ckptlib_preemption_worker.py")


def test_sigterm_sets_the_flag_and_uninstall_restores_the_old_handler():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        handler = PreemptionHandler().install()
        assert not handler.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert handler.wait(5) and handler.requested
        assert handler.received_signal == signal.SIGTERM and seen == []
        handler.uninstall()
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
        handler.reset()
        assert not handler.requested
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_loop_saves_at_the_next_step_boundary_and_resume_continues(tmp_path):
    def run(start_state, steps, kill_at=None):
        with CheckpointManager(tmp_path, max_to_keep=2) as mgr, PreemptionHandler() as handler:
            restored = resume(mgr)
            state = restored.state if restored else start_state
            begin = restored.step + 1 if restored else 0
            for step in range(begin, steps):
                state = {"x": state["x"] + 1, "step": step}
                if step == kill_at:
                    os.kill(os.getpid(), signal.SIGTERM)
                if handler.requested:
                    mgr.save(step, state, data_state={"next": step + 1})
                    mgr.wait()
                    return state, "preempted"
            return state, "done"

    state, how = run({"x": np.zeros(3)}, 10, kill_at=4)
    assert how == "preempted" and state["step"] == 4
    final, how = run(None, 10)
    assert how == "done" and final["step"] == 9
    np.testing.assert_array_equal(final["x"], np.full(3, 10.0))  # same as an uninterrupted run


def test_resume_returns_none_when_there_is_nothing(tmp_path):
    with CheckpointManager(tmp_path) as mgr:
        assert resume(mgr) is None


def test_single_process_sync_point_is_the_flag():
    with PreemptionHandler() as handler:
        assert not handler.reached_sync_point(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert handler.wait(5) and handler.reached_sync_point(2)
        assert agree_on_signal(None, 3) is None and agree_on_signal(15, 3) == 15


def _log(tmp_path: Path, i: int) -> str:
    return (tmp_path / f"log{i}.txt").read_text()


def _run_and_signal_process_1(tmp_path: Path, deadline: float) -> list[subprocess.Popen]:
    """Both workers stepping; once both are past step 3, SIGTERM to process 1 alone."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    port = str(free_port())
    procs = []
    for i in range(2):
        with open(tmp_path / f"log{i}.txt", "w") as log:
            args = [sys.executable, str(WORKER), str(i), port, str(tmp_path / "ckpt")]
            procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        while not all("STEP 3\n" in _log(tmp_path, i) for i in range(2)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                return procs
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:  # one left waiting for its sibling is killed, and shows as -9
            if p.poll() is None:
                p.kill()
            p.wait()
    return procs


@pytest.mark.multiprocess
def test_sigterm_to_one_of_two_processes_saves_the_same_step_on_both(tmp_path):
    deadline = time.monotonic() + 180
    for _attempt in range(3):  # a new port when another program took the free one first
        shutil.rmtree(tmp_path / "ckpt", ignore_errors=True)
        procs = _run_and_signal_process_1(tmp_path, deadline)
        if "already in use" not in _log(tmp_path, 0).lower():
            break
    logs = "\n".join(_log(tmp_path, i)[-2000:] for i in range(2))
    assert [p.returncode for p in procs] == [143, 143], logs
    saved = [re.findall(r"^SAVED (\d+)$", _log(tmp_path, i), re.M) for i in range(2)]
    assert len(saved[0]) == 1 and saved[0] == saved[1], logs
    step = int(saved[0][0])
    assert step >= 3
    with CheckpointManager(tmp_path / "ckpt", read_only=True) as mgr:
        assert mgr.all_steps() == [step]
        restored = mgr.restore()
    assert restored.state["step"] == step
    np.testing.assert_array_equal(restored.state["x"], np.full(8, step, np.float32))
