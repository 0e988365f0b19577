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


def _conditions_module():
    sys.path.insert(0, str(SCRIPT.parents[1]))
    try:
        import conditions
    finally:
        sys.path.pop(0)
    return conditions


def test_conditions_count_the_benchmarks_own_cpu_time_not_as_other_work():
    conditions = _conditions_module()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"
    with conditions.measure_conditions(packages=["jax"], sample_every_s=0.5) as run:
        subprocess.run([sys.executable, "-c", burn], check=True)
    meta = run.as_dict()
    # The child's 1.5 s of CPU over a wall of at least 1.5 s: close to one core, never more.
    assert 0.3 < meta["own_cpu_cores"] <= 1.05, meta
    # Two cores, a load of 2 during the run that is all the benchmark's own: quiet.
    meta["cpu_cores"] = 2
    meta["load_average_1min"] = {
        "before": 0.1,
        "during_median": 2.0,
        "during_max": 2.2,
        "after": 1.0,
    }
    meta["own_cpu_cores"] = 1.9
    assert "a quiet machine" in conditions.conditions_markdown(meta)
    meta["own_cpu_cores"] = 0.2  # the same load from other work
    assert "a shared, busy machine" in conditions.conditions_markdown(meta)
