"""Stop signals at any time of a run (damaged checkpoints and resumes: test_train.py).

The signal tests run `jaxstack-train` as a process and wait until it has installed its handler
(read from /proc) or printed a step before signalling, so they do not depend on timing.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from jaxstack.trainer import load_config, read_jsonl, train

SHORT = [
    "eval.every=0",
    "log.sample_tokens=0",
    "log.report=false",
    "log.tensorboard=false",
    "log.progress=plain",
]


def _cli(run_dir: pathlib.Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "jaxstack.trainer._src.cli", "--config", "test", f"--run-dir={run_dir}"),
            *SHORT,
            *overrides,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler installed for `signum` (SigCgt in /proc)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_startup_exits_at_once_saying_nothing_was_saved(tmp_path, signum, status):
    proc = _cli(tmp_path / "run", "train.steps=50")
    deadline = time.monotonic() + 60
    # SIGTERM's handler is installed together with SIGINT's (Python catches SIGINT from the start)
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None and time.monotonic() < deadline, "handler never installed"
        time.sleep(0.01)
    sent = time.monotonic()
    proc.send_signal(signum)
    out, err = _finish(proc)
    assert proc.returncode == status, err
    assert time.monotonic() - sent < 30
    name = signal.Signals(signum).name
    assert err.strip().splitlines() == [
        f"jaxstack-train: stopped by {name} during start-up, before the first step; "
        "nothing was saved"
    ]
    assert "done" not in out
    assert not (tmp_path / "run" / "checkpoints").exists() or not list(
        (tmp_path / "run" / "checkpoints").glob("step_*")
    )


def test_sigterm_mid_run_saves_the_step_reached_exits_143_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc = _cli(run_dir, "train.steps=400", "checkpoint.every=1000", "log.every=1")
    for line in proc.stdout:
        if line.startswith("step") and "/400" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = _finish(proc)
    assert proc.returncode == 143, err
    assert "done" not in out and "Traceback" not in err
    [stopped] = [x for x in err.splitlines() if x.startswith("stopped:")]
    step = int(stopped.split(" at step ")[1].split()[0])
    assert f"saved checkpoint step {step} in " in stopped
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*")] == [f"step_{step:08d}"]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert records[-1]["kind"] == "summary" and records[-1]["stopped"] == "SIGTERM"
    assert not [r for r in records if r["kind"] == "eval"]  # no final evaluation after the stop
    # the same run with a nearer end resumes from the saved step and finishes
    config = load_config("test", [*SHORT, f"log.run_dir={run_dir}", f"train.steps={step + 2}"])
    resumed = train(config)
    assert resumed.step == step + 2 and resumed.stopped is None
    first = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"][step]
    assert first["step"] == step + 1  # the first step after the saved one, not step 1 again


def test_a_startup_signal_swallowed_by_a_callback_still_stops_before_the_first_step(tmp_path):
    # Python runs a signal handler wherever the main thread is; inside a weakref callback (as
    # importlib's module locks use during JAX's import) the handler's `Stopped` is "ignored" by
    # the interpreter: a traceback on stderr, and start-up went on to train. The stop must
    # still happen before the first step, with nothing saved and no traceback.
    script = f"""
import signal, weakref
from jaxstack.trainer import load_config, train
from jaxstack.trainer._src.signals import STOP
STOP.install()

class Module:
    pass

m = Module()
guard = weakref.ref(m, lambda _: signal.raise_signal(signal.SIGINT))
del m  # the handler raises inside the callback, where Python swallows the exception
train(load_config("test", ["log.run_dir={tmp_path / "run"}", "train.steps=3"]))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" in proc.stderr and "Stopped: SIGINT" in proc.stderr.splitlines()[-1]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []  # nothing saved


def test_a_signal_landing_during_the_stop_agreement_waits_for_the_next_one(monkeypatch):
    """Every process must answer the same: the answer is what the all-gather saw. A signal that
    lands while the gather runs (here: inside it) is the next step's, for every process; read
    from the flag afterwards, it stopped its process alone, and the others waited for it."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from jaxstack.trainer._src.signals import StopSignals

    stop = StopSignals()

    def gather_while_a_signal_lands(value):
        stop.signum = signal.SIGTERM  # the handler ran in the middle of the collective
        return np.array([value, 0])

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", gather_while_a_signal_lands)
    assert stop.agreed() is False
    assert stop.agreed() is True  # the next agreement carries it
