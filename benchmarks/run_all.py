"""Every CPU benchmark in one command, then benchmarks/RESULTS.md from their results files.

    .venv/bin/python benchmarks/run_all.py --quick          # every benchmark's quick mode
    .venv/bin/python benchmarks/run_all.py                  # full runs (long: tens of minutes)
    .venv/bin/python benchmarks/run_all.py --only nnlib,optlib --quick
    .venv/bin/python benchmarks/run_all.py --report-only    # just rewrite RESULTS.md

Quick runs write into `<benchmark>/quick/` and leave the full results alone. RESULTS.md reads
each benchmark's full `results.json` (and its quick one), puts the headline comparison with the
peer in a table with the ratio, draws the ratios in `plots/<benchmark>.png`, and copies the run
conditions the script measured (benchmarks/conditions.py); a results file written before the
scripts measured their conditions is marked as such.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conditions import conditions_markdown  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One headline comparison: jaxstack against a peer, same settings unless `setting` says."""

    what: str
    jaxstack: float
    peer_name: str
    peer: float
    unit: str
    higher_is_better: bool
    setting: str = "same for both"

    @property
    def advantage(self) -> float:
        """How many times better jaxstack is (> 1) or worse (< 1) than the peer."""
        ratio = self.jaxstack / self.peer
        return ratio if self.higher_is_better else 1 / ratio


@dataclass(frozen=True)
class Benchmark:
    name: str
    what: str
    full: list[str]
    quick: list[str] | None
    headline: Callable[[dict], list[Row]]
    env: dict[str, str] = field(default_factory=dict)
    results: tuple[str, ...] = ("results.json",)  # globs; one section per file found


def ckptlib_rows(r: dict) -> list[Row]:
    save, restore = r["save"], r["restore"]
    peer = "orbax StandardCheckpointer (async)"
    return [
        Row("save, total s", save["ckptlib async"]["total_s_median"], "Orbax async",
            save[peer]["total_s_median"], "s", False,
            "ckptlib also fsyncs and hashes every file"),
        Row("save, s the caller is blocked", save["ckptlib async"]["blocked_s_median"],
            "Orbax async", save[peer]["blocked_s_median"], "s", False),
        Row("restore, s", restore["ckptlib restore (no verify)"]["s_median"], "Orbax",
            restore["orbax StandardCheckpointer.restore"]["s_median"], "s", False),
    ]  # fmt: skip


def datalib_rows(r: dict) -> list[Row]:
    return [
        Row(f"{o['tokenizer']} tokens, {o['workers']} workers, tokens/CPU-s",
            o["datalib_tokens_per_cpu_sec"], "Grain written by hand",
            o["grain_tokens_per_cpu_sec"], "tokens/CPU-s", True)
        for o in r["overhead"]
    ]  # fmt: skip


def optlib_rows(r: dict) -> list[Row]:
    rows = [
        Row(f"cross-entropy temp memory, {m['dtype']} {m['mode']}, V={m['V']}",
            m["chunked"]["temp_bytes"] / 2**30, "Optax (full logits)",
            m["naive"]["temp_bytes"] / 2**30, "GiB", False)
        for m in r["loss_memory"]
    ]  # fmt: skip
    o = r["optimizer_time"]
    rows.append(
        Row("AdamW update, ms", o["optlib_recipe_s"] * 1e3, "Optax chain by hand",
            o["hand_written_optax_s"] * 1e3, "ms", False)
    )  # fmt: skip
    return rows


def nnlib_rows(r: dict) -> list[Row]:
    return [
        Row(f"fwd+bwd {f['model']} (d={f['d_model']}), tokens/s", f["tokens_per_s_nnlib"],
            f"HF transformers {f['transformers']} (torch {f['torch']})", f["tokens_per_s_hf"],
            "tokens/s", True)
        for f in r["fwd_bwd"]
    ]  # fmt: skip


def kernels_rows(r: dict) -> list[Row]:
    reference = {
        row["seq"]: row["median_ms"]
        for row in r["rows"]
        if str(row.get("contender", "")).startswith("kernlib implementation=None") and "seq" in row
    }
    return [
        Row(f"attention fwd+bwd T={row['seq']}, ms", reference[row["seq"]], row["contender"],
            row["median_ms"], "ms", False)
        for row in r["rows"]
        if row.get("contender", "").startswith("jax.nn") and row.get("median_ms")
        and row.get("seq") in reference
    ]  # fmt: skip


def prof_rows(r: dict) -> list[Row]:
    by_mode = {row["mode"]: row for row in r["rows"]}
    ours, peer = by_mode.get("xprof_lite trace"), by_mode.get("peer: jax.profiler.trace")
    if not (ours and peer):
        return []
    key = next(k for k in ("median_step_cpu_ms", "median_step_ms") if k in ours)
    return [Row(f"traced step, {key}", ours[key], "jax.profiler.trace", peer[key], "ms", False)]


def serving_models_rows(r: dict) -> list[Row]:
    rows = []
    for mode, cells in r["modes"].items():
        if mode == "batch_size_1":
            continue
        for cell, base in zip(cells, r["modes"]["batch_size_1"], strict=True):
            rows.append(
                Row(f"{mode}, concurrency {cell['concurrency']}, req/s",
                    cell["requests_per_s"], "same server, batch size 1",
                    base["requests_per_s"], "req/s", True)
            )  # fmt: skip
    return rows


def allocator(settings: str) -> str:
    """'retain' or 'system': the host-allocator setting a train row's settings name."""
    retained = "retain" in settings or "arena_max" in settings
    return "retain" if retained and "(system)" not in settings else "system"


def train_rows(r: dict) -> list[Row]:
    """jaxstack fp32 against each peer, with the same host-allocator setting where the run has
    it; a pair whose settings still differ says so."""
    rows = []
    for case in sorted({row["case"] for row in r["rows"]}):
        cells = [row for row in r["rows"] if row["case"] == case]
        ours = [c for c in cells if c["trainer"].startswith("jaxstack fp32")]
        for peer in (c for c in cells if not c["trainer"].startswith("jaxstack")):
            peer_settings = peer.get("settings", "")
            same = [c for c in ours if allocator(c.get("settings", "")) == allocator(peer_settings)]
            mine = (same or ours)[0]
            differs = mine.get("settings", "") != peer_settings and not same
            setting = (
                f"jaxstack: {mine.get('settings', 'not recorded')}; "
                f"peer: {peer_settings or 'not recorded'}"
                if differs or not peer_settings
                else f"fp32, host allocator {allocator(peer_settings)} for both"
            )
            rows.append(
                Row(f"{case} train step, tokens/s", mine["tokens_per_sec"], peer["trainer"],
                    peer["tokens_per_sec"], "tokens/s", True, setting)
            )  # fmt: skip
    return rows


BENCHMARKS = [
    Benchmark("ckptlib", "checkpoint save/restore vs Orbax, TensorStore, numpy",
              ["ckptlib/bench_ckpt.py"], ["ckptlib/bench_ckpt.py", "--quick"], ckptlib_rows),
    Benchmark("datalib", "packed, tokenized input pipeline vs the same Grain code by hand",
              ["datalib/bench_pipeline.py"], ["datalib/bench_pipeline.py", "--quick"],
              datalib_rows),
    Benchmark("optlib", "chunked cross-entropy memory, optimiser recipe vs hand-written Optax",
              ["optlib/bench_optlib.py"], ["optlib/bench_optlib.py", "--quick"], optlib_rows,
              {"JAX_PLATFORMS": "cpu"}),
    Benchmark("nnlib", "model fwd+bwd vs HF transformers (torch), dispatch overhead",
              ["nnlib/bench.py"], ["nnlib/bench.py", "--quick"], nnlib_rows),
    Benchmark("kernels", "kernlib kernels vs jax.nn (CPU: smoke sizes only)",
              ["kernels/run.py", "--tiny"], ["kernels/run.py", "--tiny", "--out", "kernels/quick"],
              kernels_rows),
    Benchmark("prof", "tracing overhead of xprof-lite vs jax.profiler",
              ["prof/bench_overhead.py"],
              ["prof/bench_overhead.py", "--rounds", "2", "--steps", "10", "--out", "prof/quick"],
              prof_rows),
    Benchmark("serving-models", "KServe v2 model server, dynamic batching vs batch size 1",
              ["serving-models/bench.py"],
              ["serving-models/bench.py", "--quick", "--out", "serving-models/quick"],
              serving_models_rows),
    Benchmark("train", "training throughput vs minimal torch, HF Llama and MaxText",
              ["train/run.py"], None, train_rows,
              results=("results-intel-*.json", "results-amd-*.json",
                       "results-matmul-backend-intel-*.json",
                       "results-matmul-backend-d512-*.json")),
]  # fmt: skip


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def conditions_of(results: dict) -> dict | None:
    """The measured run conditions: under "conditions", or (train/run.py) spread into "meta"."""
    for holder in (results, results.get("meta", {})):
        if isinstance(holder, dict) and "load_average_1min" in holder.get("conditions", {}):
            return holder["conditions"]
        if isinstance(holder, dict) and "load_average_1min" in holder:
            return holder
    return None


def run(benchmark: Benchmark, quick: bool) -> str:
    args = benchmark.quick if quick else benchmark.full
    if args is None:
        return f"{benchmark.name}: no quick mode; run it in full (`--only {benchmark.name}`)"
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(HERE / args[0]), *args[1:]],
        cwd=HERE,
        env={**os.environ, **benchmark.env},
        check=False,
    )
    took = time.perf_counter() - start
    status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
    return f"{benchmark.name}: {status} in {took:.0f} s"


def plot(name: str, rows: list[Row]) -> str | None:
    """A bar per headline row: how many times better jaxstack is than the peer."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    labels = [f"{r.what}\nvs {r.peer_name}" for r in rows]
    values = [r.advantage for r in rows]
    axes.barh(labels, values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.set_xlabel("times better than the peer (> 1: jaxstack ahead)")
    axes.tick_params(axis="y", labelsize=7)
    axes.invert_yaxis()
    figure.tight_layout()
    (HERE / "plots").mkdir(exist_ok=True)
    path = HERE / "plots" / f"{name}.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return f"plots/{name}.png"


def section(benchmark: Benchmark) -> list[str]:
    folder = HERE / benchmark.name
    found = sorted({p for pattern in benchmark.results for p in folder.glob(pattern)})
    quick = folder / "quick" / "results.json"
    lines = [f"## {benchmark.name}: {benchmark.what}", ""]
    if not found and not quick.exists():
        return [*lines, "No results yet.", ""]
    for path in found or [quick]:
        lines += results_table(benchmark, path)
    if found and quick.exists():
        lines += [f"Quick run: [quick/results.md]({benchmark.name}/quick/results.md).", ""]
        if q := conditions_of(load(quick)):
            lines += [f"Conditions of the quick run: {conditions_markdown(q)}", ""]
    return lines


def results_table(benchmark: Benchmark, path: Path) -> list[str]:
    """The headline rows of one results file, its plot, links and run conditions."""
    source = path.relative_to(HERE).as_posix()
    results = load(path)
    lines = [f"From [{path.name}]({source}) ([Markdown]({source.removesuffix('.json')}.md)):", ""]
    try:
        rows = benchmark.headline(results)
    except (KeyError, TypeError, ZeroDivisionError, StopIteration) as error:
        rows = []
        lines += [f"(headline not readable: {error!r}; see the file)", ""]
    if rows:
        lines += [
            "| comparison | jaxstack | peer | peer value | jaxstack advantage | settings |",
            "|---|---:|---|---:|---:|---|",
        ]
        lines += [
            f"| {r.what} | {r.jaxstack:,.3g} {r.unit} | {r.peer_name} | {r.peer:,.3g} {r.unit} "
            f"| {r.advantage:.2f}x | {r.setting} |"
            for r in rows
        ]
        lines.append("")
        name = f"{benchmark.name}-{path.stem}" if path.stem != "results" else benchmark.name
        if picture := plot(name, rows):
            lines += [f"![{name} ratios]({picture})", ""]
    conditions = conditions_of(results)
    lines.append(
        "Conditions: "
        + (conditions_markdown(conditions) if conditions else "**not measured** (written before "
           "the script recorded its run conditions; its own header states what was known).")
    )  # fmt: skip
    return [*lines, ""]


def write_report() -> Path:
    for old in (HERE / "plots").glob("*.png"):
        old.unlink()
    known = {b.name for b in BENCHMARKS}
    others = sorted(
        p.name
        for p in HERE.iterdir()
        if p.is_dir() and p.name not in known | {"plots", "__pycache__"}
    )
    lines = [
        "# Benchmark results",
        "",
        "Written by `benchmarks/run_all.py` from each benchmark's results files; every number "
        "links to the file it comes from. *jaxstack advantage* is how many times better jaxstack "
        "is than the peer on that row (higher throughput or lower time/memory): above 1 jaxstack "
        "is ahead. Rows compare the same settings unless the settings column says otherwise.",
        "",
    ]
    for benchmark in BENCHMARKS:
        lines += section(benchmark)
    for name in others:
        pages = [f"[{p.name}]({name}/{p.name})" for p in sorted((HERE / name).glob("*.md"))]
        lines += [f"## {name}", "", f"Not yet summarised here: {', '.join(pages) or name}.", ""]
    path = HERE / "RESULTS.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's quick mode")
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--report-only", action="store_true", help="only rewrite RESULTS.md")
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only.split(",")]
    summary = [] if args.report_only else [run(b, args.quick) for b in chosen]
    path = write_report()
    print("\n".join([*summary, f"wrote {path}"]))
    return 1 if any("FAILED" in line for line in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
