"""Benchmark scripts run end to end on CPU and write their Markdown and JSON tables.

They live here rather than in a package's tests because every script records its run conditions
through benchmarks/conditions.py, which reads the CPU through xprof-lite: a package's own test
session has only that package and its declared dependencies installed."""

import importlib
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


def _benchmarks_module(name: str):
    """A module of the benchmarks folder (not a package), imported by name."""
    sys.path.insert(0, str(SCRIPT.parents[1]))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_conditions_name_the_workspace_version_when_the_installed_metadata_is_stale(monkeypatch):
    """A workspace package bumped after its editable install: the run measured the source, so
    the recorded version must be the source's, not the stale metadata's."""
    conditions = _benchmarks_module("conditions")
    real = conditions.importlib.metadata.version
    stale = {"jaxstack-serving": "0.0.1"}
    monkeypatch.setattr(
        conditions.importlib.metadata, "version", lambda name: stale.get(name) or real(name)
    )
    source = conditions.workspace_version("jaxstack-serving")
    versions = conditions.package_versions(["jax", "jaxstack-serving", "jaxstack-nnlib"])
    assert versions["jax"] == real("jax")
    assert versions["jaxstack-serving"].startswith(f"{source} (source;")
    assert "0.0.1" in versions["jaxstack-serving"]
    assert versions["jaxstack-nnlib"] == conditions.workspace_version("jaxstack-nnlib")


def test_conditions_count_the_benchmarks_own_cpu_time_not_as_other_work():
    conditions = _benchmarks_module("conditions")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"
    with conditions.measure_conditions(packages=["jax"], sample_every_s=0.5) as run:
        subprocess.run([sys.executable, "-c", burn], check=True)
    meta = run.as_dict()
    # The child's 1.5 s of CPU (and its start-up) counted as the benchmark's own, never more
    # than one core; on a loaded machine the wall time, and so the cores' share, varies.
    assert 1.45 <= meta["own_cpu_cores"] * meta["wall_s"] <= 3.0, meta
    assert meta["own_cpu_cores"] <= 1.05, meta
    # Other processes' CPU time, from /proc/stat, before and during (whatever else runs here).
    assert meta["other_cpu_cores"]["before"] >= 0 and meta["other_cpu_cores"]["during"] >= 0
    # Two cores, a load of 2 during the run that is all the benchmark's own: quiet.
    meta["other_cpu_cores"] = None  # as in results written before it was measured
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


def test_conditions_do_not_count_the_previous_benchmarks_load_as_other_work():
    conditions = _benchmarks_module("conditions")
    # In a run_all sitting: the previous benchmark kept both cores busy, so the 1-minute load
    # before this one is 1.9; this one keeps 1.8 cores busy itself, nothing else runs.
    meta = {
        "cpu_cores": 2,
        "load_average_1min": {"before": 1.9, "during_median": 2.0, "during_max": 2.1},
        "own_cpu_cores": 1.8,
    }
    assert not conditions.was_busy(meta)
    # Measured CPU time of other processes decides where recorded, whatever the load says.
    meta["other_cpu_cores"] = {"before": 0.05, "during": 0.1}
    meta["load_average_1min"]["during_median"] = 3.5
    assert not conditions.was_busy(meta)
    meta["other_cpu_cores"] = {"before": 0.05, "during": 1.2}  # another job took over a core
    assert conditions.was_busy(meta)
    meta["other_cpu_cores"] = {"before": 1.6, "during": 0.3}  # it was running when we began
    assert conditions.was_busy(meta)


FAKE_BENCHMARK = """import argparse, json, pathlib, sys
sys.path.insert(0, {benchmarks!r})
from conditions import measure_conditions
parser = argparse.ArgumentParser()
parser.add_argument("--out", type=pathlib.Path)
parser.add_argument("--fail", action="store_true")
parser.add_argument("--rounds", type=int)
args = parser.parse_args()
if args.fail:
    sys.exit(3)
rounds = pathlib.Path({counter!r})
done = int(rounds.read_text()) if rounds.exists() else 0
rounds.write_text(str(done + 1))
with measure_conditions(packages=["jax"], sample_every_s=60) as conditions:
    ours = [1.2, 1.3, 0.9][done % 3]  # jaxstack's throughput per round; the peer's is 1.0
args.out.mkdir(parents=True)
results = {{"ours": ours, "peer": 1.0, "rounds": args.rounds, "conditions": conditions.as_dict()}}
(args.out / "results.json").write_text(json.dumps(results))
(args.out / "results.md").write_text("fake")
"""


def test_run_all_reports_each_machine_kind_from_interleaved_rounds(tmp_path, monkeypatch):
    run_all = _benchmarks_module("run_all")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    (tmp_path / "fake.py").write_text(
        FAKE_BENCHMARK.format(benchmarks=str(SCRIPT.parents[1]), counter=str(tmp_path / "n"))
    )

    def headline(r):
        return [run_all.Row("speed", r["ours"], "peer", r["peer"], "x/s", True)]

    fake = run_all.Benchmark("fake", "a fake benchmark", ["fake.py"], None, headline)
    summary = run_all.run_rounds([fake], rounds=3, kind="kind-a")
    assert [line.split(":")[0] for line in summary] == [f"fake round {n}/3" for n in (1, 2, 3)]
    rounds = sorted(p.name for p in (tmp_path / "fake" / "runs" / "kind-a").iterdir())
    assert rounds == ["round-1", "round-2", "round-3"]

    # A second kind, measured in two rounds where jaxstack was ahead both times.
    for n, ours in ((1, 1.5), (2, 1.7)):
        folder = tmp_path / "fake" / "runs" / "kind-b" / f"round-{n}"
        folder.mkdir(parents=True)
        first = json.loads((tmp_path / "fake/runs/kind-a/round-1/results.json").read_text())
        (folder / "results.json").write_text(json.dumps({**first, "ours": ours}))
    lines = run_all.section(fake)
    row = next(line for line in lines if line.startswith("| speed |"))
    # kind-a: 1.2, 1.3, 0.9 -> the range includes 1.0, so parity; kind-b: 1.5, 1.7 -> ahead.
    assert (
        row == "| speed | peer | parity (1.20x [0.90, 1.30]) | 1.60x [1.50, 1.70] | same for both |"
    )
    assert any(line.startswith("- **kind-a**, 3 rounds: Run ") for line in lines)


def test_run_all_keeps_the_previous_rounds_when_a_round_fails(tmp_path, monkeypatch):
    run_all = _benchmarks_module("run_all")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    (tmp_path / "fake.py").write_text(
        FAKE_BENCHMARK.format(benchmarks=str(SCRIPT.parents[1]), counter=str(tmp_path / "n"))
    )
    previous = tmp_path / "fake" / "runs" / "kind-a" / "round-1"
    previous.mkdir(parents=True)
    (previous / "results.json").write_text("{}")
    failing = run_all.Benchmark("fake", "fails", ["fake.py", "--fail"], None, lambda r: [])
    summary = run_all.run_rounds([failing], rounds=2, kind="kind-a")
    assert "FAILED (exit 3)" in summary[0]
    assert summary[-1].startswith("fake: kept the previous rounds")
    assert (previous / "results.json").read_text() == "{}"
    assert run_all.rounds_by_kind(failing) == {"kind-a": [previous / "results.json"]}


def test_run_all_replaces_a_kinds_rounds_and_keeps_its_other_runs(tmp_path, monkeypatch):
    """A kind's folder also holds runs made by hand (benchmarks/rl's `vs-trl-<date>-...`,
    linked from its README): new rounds replace the old rounds only."""
    run_all = _benchmarks_module("run_all")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    (tmp_path / "fake.py").write_text(
        FAKE_BENCHMARK.format(benchmarks=str(SCRIPT.parents[1]), counter=str(tmp_path / "n"))
    )
    kind = tmp_path / "fake" / "runs" / "kind-a"
    for old in ("round-1", "round-2", "round-3", "by-hand/round-1"):
        (kind / old).mkdir(parents=True)
        (kind / old / "results.json").write_text("{}")
    fake = run_all.Benchmark("fake", "a fake benchmark", ["fake.py"], None, lambda r: [])
    run_all.run_rounds([fake], rounds=2, kind="kind-a")
    assert sorted(p.name for p in kind.iterdir()) == ["by-hand", "round-1", "round-2"]
    assert (kind / "by-hand" / "round-1" / "results.json").read_text() == "{}"
    assert json.loads((kind / "round-2" / "results.json").read_text())["ours"] == 1.3


def test_run_all_runs_a_benchmark_with_rounds_of_its_own_once(tmp_path, monkeypatch):
    run_all = _benchmarks_module("run_all")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    (tmp_path / "fake.py").write_text(
        FAKE_BENCHMARK.format(benchmarks=str(SCRIPT.parents[1]), counter=str(tmp_path / "n"))
    )
    own = run_all.Benchmark("fake", "own rounds", ["fake.py"], None, lambda r: [], own_rounds=True)
    summary = run_all.run_rounds([own], rounds=3, kind="kind-a")
    assert [line.split(":")[0] for line in summary] == ["fake 3 rounds of its own"]
    (results,) = run_all.rounds_by_kind(own)["kind-a"]
    assert json.loads(results.read_text())["rounds"] == 3


def test_run_all_pools_two_runs_of_own_rounds_and_says_so(tmp_path, monkeypatch):
    run_all = _benchmarks_module("run_all")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    (tmp_path / "fake.py").write_text(
        FAKE_BENCHMARK.format(benchmarks=str(SCRIPT.parents[1]), counter=str(tmp_path / "n"))
    )
    headline = lambda r: [run_all.Row("speed", r["ours"], "peer", r["peer"], "x/s", True)]
    own = run_all.Benchmark("fake", "own rounds", ["fake.py"], None, headline, own_rounds=True)
    run_all.run_rounds([own], rounds=3, kind="kind-a")
    lines = run_all.section(own)
    assert any(line.startswith("- **kind-a**, rounds inside one run: Run ") for line in lines)
    # A second run of the script, kept beside the first (`--out .../round-2`): both are pooled.
    runs = tmp_path / "fake" / "runs" / "kind-a"
    first = json.loads((runs / "round-1" / "results.json").read_text())
    (runs / "round-2").mkdir()
    (runs / "round-2" / "results.json").write_text(json.dumps({**first, "ours": 1.6}))
    lines = run_all.section(own)
    row = next(line for line in lines if line.startswith("| speed |"))
    assert row == "| speed | peer | 1.40x [1.20, 1.60] | same for both |"
    (line,) = [line for line in lines if line.startswith("- **kind-a**")]
    assert line.startswith("- **kind-a**, 2 runs of rounds, pooled: Run ")
    assert "[round-1](" in line and "[round-2](" in line


def test_run_all_gives_figures_and_first_round_arguments(tmp_path, monkeypatch):
    run_all = _benchmarks_module("run_all")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    script = FAKE_BENCHMARK.format(benchmarks=str(SCRIPT.parents[1]), counter=str(tmp_path / "n"))
    script = script.replace(
        'parser.add_argument("--fail"',
        'parser.add_argument("--long", action="store_true")\nparser.add_argument("--fail"',
    ).replace('"rounds": args.rounds,', '"rounds": args.rounds, "long": args.long,')
    (tmp_path / "fake.py").write_text(script)

    def figures(r):
        found = [run_all.Figure("start-up", r["ours"], "s")]
        if r["long"]:
            found.append(run_all.Figure("long part", 9.5, "min"))
        return found

    fake = run_all.Benchmark(
        "fake", "figures", ["fake.py"], None, lambda r: [], figures=figures, first_round=["--long"]
    )
    run_all.run_rounds([fake], rounds=3, kind="kind-a")
    files = run_all.rounds_by_kind(fake)["kind-a"]
    assert [json.loads(f.read_text())["long"] for f in files] == [True, False, False]
    lines = run_all.section(fake)
    assert "| start-up | 1.2 s [0.9, 1.3] |" in lines
    assert "| long part | 9.5 min (1 round) |" in lines


def test_run_all_calls_a_difference_inside_its_own_noise_parity():
    run_all = _benchmarks_module("run_all")
    # Perplexity 0.2% better than the peer in every round, but two standard errors are 0.3%.
    ahead = run_all.Spread((1.002, 1.002, 1.002), (0.003, 0.003, 0.003))
    assert ahead.parity and ahead.cell() == "parity (1.00x [1.00, 1.00], noise ± 0.3%)"
    assert not run_all.Spread((1.2, 1.3), (0.05, 0.05)).parity
