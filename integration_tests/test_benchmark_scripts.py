"""Benchmark scripts run end to end on CPU and write their Markdown and JSON tables.

They live here rather than in a package's tests because every script records its run conditions
through benchmarks/conditions.py, which reads the CPU through xprof-lite: a package's own test
session has only that package and its declared dependencies installed."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels" / "run.py"


def test_kernels_tiny_run_writes_tables(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--seqs",
            "32",
            "--decode-batches",
            "2",
            "--context",
            "32",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["platform"] == "cpu"
    contenders = {r["contender"] for r in data["rows"]}
    assert "kernlib xla (reference)" in contenders
    assert "kernlib implementation=None (-> xla)" in contenders
    assert all(r["status"] == "ok" and r["median_ms"] > 0 for r in data["rows"])
    ref = [r for r in data["rows"] if r["contender"] == "kernlib xla (reference)"]
    assert all(r["vs_reference"] == 1.0 for r in ref)
    md = (tmp_path / "results.md").read_text()
    assert "GPU numbers are not measured yet" in md and "| 32 |" in md
