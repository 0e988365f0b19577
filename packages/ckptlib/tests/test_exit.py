"""Processes that end while a save is in flight, or whose disk fills up mid-save."""

import os
import subprocess
import sys

import pytest

from jaxstack.ckptlib import CheckpointManager

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}


def run_script(body: str, timeout: float = 240) -> subprocess.CompletedProcess:
    script = "import numpy as np\nfrom jaxstack.ckptlib import CheckpointManager\n" + body
    return subprocess.run(
        [sys.executable, "-c", script], env=ENV, timeout=timeout, capture_output=True, text=True
    )


@pytest.mark.timeout(300)
def test_a_script_ending_with_a_save_in_flight_exits_cleanly_and_commits_nothing(tmp_path):
    """Python >= 3.12 starts no thread once exit begins, and Orbax needs some to finish; the
    save is abandoned at once (it used to fail with tracebacks, or hang), with one line."""
    proc = run_script(
        f"mgr = CheckpointManager({str(tmp_path)!r})\n"
        "mgr.save(1, {'w': np.arange(10**6, dtype=np.float32)})\n"
    )
    assert proc.returncode == 0
    [line] = proc.stderr.strip().splitlines()
    assert "step 1 is still being saved" in line and "not committed" in line
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("step_")]
    with CheckpointManager(tmp_path) as mgr:
        assert mgr.all_steps() == [] and mgr.removed_tmp_dirs
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


DISK_FULL = """
import resource, signal
from jaxstack.ckptlib import CheckpointSaveError
managers = {{mode: CheckpointManager(f"{root}/{{mode}}", async_save=mode == "async")
            for mode in ("async", "sync")}}
for mgr in managers.values():
    mgr.save(1, {{'w': np.ones(1000, np.float32)}})
    mgr.wait()
# Files may not grow past 1 MiB from here on: writes fail with EFBIG, as on a full disk.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
big = np.random.default_rng(0).standard_normal(1 << 21, dtype=np.float32)
for mgr in managers.values():
    try:
        mgr.save(2, {{'w': big}})
        mgr.close()
    except CheckpointSaveError as e:
        print(e)
"""


@pytest.mark.timeout(300)
def test_a_full_disk_gives_one_clear_error_and_keeps_the_previous_step(tmp_path):
    proc = run_script(DISK_FULL.format(root=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == ""  # nothing from Orbax/asyncio on the console
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2  # one line per failed save, async and sync
    for mode, message in zip(("async", "sync"), lines, strict=True):
        ckpt = tmp_path / mode
        assert message.startswith(f"saving step 2 to {ckpt} failed while writing the arrays")
        assert "File too large" in message and "before it started" not in message
        assert "the latest checkpoint is still step 1" in message
        log = ckpt / "save-errors.log"
        assert message.endswith(f"details in {log}")
        assert "Traceback" in log.read_text() and "File too large" in log.read_text()
        with CheckpointManager(ckpt) as mgr:
            assert mgr.all_steps() == [1] and mgr.verify(1).ok
