"""benchmarks/kernels/run.py runs end to end on CPU and writes its Markdown and JSON tables."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "kernels" / "run.py"


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/ is not part of this checkout")
def test_tiny_run_writes_tables(tmp_path):
    subprocess.run(
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
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
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
