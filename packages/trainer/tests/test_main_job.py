"""The main job: `jaxstack-train` with no arguments, end to end, in a fresh process."""

import json
import os
import pathlib
import subprocess
import sys
import time


def test_jaxstack_train_with_no_arguments(tmp_path):
    exe = pathlib.Path(sys.executable).with_name("jaxstack-train")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "jaxstack.trainer._src.cli"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert len(train) == 200
    assert sum(r["loss"] for r in train[-10:]) / 10 < train[0]["loss"] - 2.5  # from ~5.5
    assert [e["step"] for e in evals] == [100, 200] and evals[-1]["eval_loss"] < 3.0
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step_00000100",
        "step_00000200",
    ]
    assert (run_dir / "report.html").stat().st_size > 10_000
    assert (run_dir / "config.yaml").is_file()
    assert summary["sample"].startswith("def ")
    assert f"sample: {summary['sample']!r}" in proc.stdout and "goodput" in proc.stdout
    print(f"main job wall time: {wall:.0f}s, goodput {summary['goodput']:.1%}")
