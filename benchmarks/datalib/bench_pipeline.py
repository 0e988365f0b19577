"""datalib vs the same pipeline written directly against Grain, on the default corpus.

Measures (medians of interleaved trials, start-up excluded):
  1. tokens/s of the tokenized, first-fit packed, batched pipeline, 0 and 2 worker processes,
     byte-level and BPE tokenizers: `jaxstack.datalib.lm_batches` vs hand-written Grain code
     doing the same work (shuffle, tokenize + target shift, cut, FirstFitPackIterDataset,
     batch, dict conversion, mp_prefetch). The overhead ratio should be <= 1.10.
  2. packing efficiency (non-padding fraction) at seq_len 1024 for each packing method.
  3. Grain ReadOptions for the random-access stage (whole pipeline): what Grain's default
     (16 reader threads, 500-element buffer) costs on a small host.

    .venv/bin/python benchmarks/datalib/bench_pipeline.py            # writes results.{json,md}
    .venv/bin/python benchmarks/datalib/bench_pipeline.py --quick    # a smoke run, into quick/
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

# datalib first: Grain then loads without JAX, for both sides of the comparison.
import jaxstack.datalib as dl  # isort: skip
import grain  # isort: skip
from grain.experimental import (  # isort: skip
    DatasetOptions,
    FirstFitPackIterDataset,
    FlatMapIterDataset,
    FlatMapTransform,
    WithOptionsIterDataset,
)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conditions import conditions_markdown, measure_conditions

HERE = pathlib.Path(__file__).parent
SEQ_LEN, BATCH = 1024, 8


# --- the same work, written directly against Grain -------------------------------------------
def _example(doc, tok):
    body = np.asarray(
        tok.encode_array(doc) if hasattr(tok, "encode_array") else tok.encode(doc), np.int32
    )
    ids = np.concatenate(
        [np.asarray([tok.bos_id], np.int32), body, np.asarray([tok.eos_id], np.int32)]
    )
    lm = np.empty((len(ids) - 1, 3), np.int32)
    lm[:, 0], lm[:, 1], lm[:, 2] = ids[:-1], ids[1:], 1
    return {"lm": lm}


class _Cut(FlatMapTransform):
    max_fan_out = 1 << 20

    def flat_map(self, x):
        lm = x["lm"]
        return [{"lm": lm[i : i + SEQ_LEN]} for i in range(0, len(lm), SEQ_LEN)]


def _to_dict(rows, pad_id):
    seg = rows["lm_segment_ids"]
    real = seg > 0
    lm = rows["lm"]
    return {
        "tokens": np.where(real, lm[..., 0], pad_id).astype(np.int32),
        "targets": np.where(real, lm[..., 1], pad_id).astype(np.int32),
        "segment_ids": seg.astype(np.int32),
        "positions": np.where(real, rows["lm_positions"], 0).astype(np.int32),
        "loss_mask": (real & (lm[..., 2] > 0)).astype(np.float32),
    }


def grain_direct(corpus, tok, workers, min_shm_size=1 << 20):
    ds = grain.MapDataset.source(corpus).shuffle(seed=0).repeat()
    ds = ds.map(lambda d: _example(d, tok))
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    it = FlatMapIterDataset(it, _Cut())
    it = FirstFitPackIterDataset(it, length_struct={"lm": SEQ_LEN}, num_packing_bins=256, seed=0)
    it = it.batch(BATCH, drop_remainder=True).map(lambda r: _to_dict(r, tok.pad_id))
    if workers:
        # The same transport setting as datalib (see bench_worker_transport for its effect).
        it = WithOptionsIterDataset(it, DatasetOptions(min_shm_size=min_shm_size))
        it = it.mp_prefetch(
            grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=4)
        )
    return iter(it)


def datalib(corpus, tok, workers):
    return dl.lm_batches(corpus, tok, seq_len=SEQ_LEN, batch_size=BATCH, num_workers=workers)


# --- measurement -------------------------------------------------------------------------------
def cpu_seconds() -> float:
    """CPU time of this process plus its live children (the Grain workers), from /proc."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for child in multiprocessing.active_children():
        try:
            fields = pathlib.Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def throughput(make, batches: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second of all processes involved)."""
    it = make()
    try:
        next(it)  # start-up (worker spawn, first reads) is not throughput
        tokens, start, cpu0 = 0, time.perf_counter(), cpu_seconds()
        for _ in range(batches):
            tokens += int(np.count_nonzero(next(it)["segment_ids"]))
        wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
        return tokens / wall, tokens / cpu
    finally:
        close = getattr(it, "close", None)
        if close:
            close()


def paired_wall(make_a, make_b, group: int, rounds: int) -> tuple[float, float]:
    """Tokens per wall second of two pipelines pulled in alternating rounds of `group` batches.

    Both run side by side in the same minutes, so load from other jobs on the machine falls on
    both alike (the order within a round alternates too).
    """
    its = [make_a(), make_b()]
    tokens, seconds = [0, 0], [0.0, 0.0]
    try:
        for it in its:
            next(it)  # start-up is not throughput
        for r in range(rounds):
            for side in (0, 1) if r % 2 == 0 else (1, 0):
                start = time.perf_counter()
                for _ in range(group):
                    tokens[side] += int(np.count_nonzero(next(its[side])["segment_ids"]))
                seconds[side] += time.perf_counter() - start
    finally:
        for it in its:
            close = getattr(it, "close", None)
            if close:
                close()
    return tokens[0] / seconds[0], tokens[1] / seconds[1]


def bench_overhead(corpus, tokenizers, trials, batches, group):
    rows = []
    for tok_name, tok in tokenizers.items():
        for workers in (0, 2):
            n = batches[tok_name]
            grain_make = lambda t=tok, w=workers: grain_direct(corpus, t, w)
            datalib_make = lambda t=tok, w=workers: datalib(corpus, t, w)
            wall = paired_wall(grain_make, datalib_make, group, rounds=2 * (n // group))
            cpu = {"grain": [], "datalib": []}
            for _ in range(trials):  # separate runs: CPU time must not mix the two
                cpu["grain"].append(throughput(grain_make, n)[1])
                cpu["datalib"].append(throughput(datalib_make, n)[1])
            g_cpu, d_cpu = statistics.median(cpu["grain"]), statistics.median(cpu["datalib"])
            row = {
                "tokenizer": tok_name,
                "workers": workers,
                "batches": n,
                "grain_tokens_per_sec": wall[0],
                "datalib_tokens_per_sec": wall[1],
                "grain_tokens_per_cpu_sec": g_cpu,
                "datalib_tokens_per_cpu_sec": d_cpu,
                "overhead_wall": wall[0] / wall[1],
                "overhead_cpu": g_cpu / d_cpu,
                "cpu_trials": cpu,
            }
            rows.append(row)
            print(
                f"{tok_name:>5} workers={workers}: wall grain {row['grain_tokens_per_sec']:,.0f}"
                f" datalib {row['datalib_tokens_per_sec']:,.0f} ({row['overhead_wall']:.3f}); "
                f"per CPU-s grain {row['grain_tokens_per_cpu_sec']:,.0f} datalib "
                f"{row['datalib_tokens_per_cpu_sec']:,.0f} ({row['overhead_cpu']:.3f})",
                flush=True,
            )
    return rows


def bench_packing(corpus, batches):
    out = {}
    for method in dl.PACKING_METHODS:
        it = dl.lm_batches(corpus, seq_len=SEQ_LEN, batch_size=BATCH, packing=method, seed=0)
        out[method] = dl.packing_efficiency(next(it) for _ in range(batches))
        print(f"packing {method}: {out[method]:.4f}", flush=True)
    return out


def bench_read_options(corpus, tokenizers, batches, trials):
    """The whole lm_batches pipeline (0 workers) under different Grain ReadOptions."""
    settings = {
        "grain default (16 threads, buffer 500)": grain.ReadOptions(),
        "num_threads=2, buffer 8": grain.ReadOptions(num_threads=2, prefetch_buffer_size=8),
        "num_threads=0 (datalib default)": grain.ReadOptions(num_threads=0, prefetch_buffer_size=0),
    }
    out = {}
    for tok_name, tok in tokenizers.items():
        runs = {name: [] for name in settings}
        for _ in range(trials):
            for name, options in settings.items():
                make = lambda t=tok, o=options: dl.lm_batches(
                    corpus, t, seq_len=SEQ_LEN, batch_size=BATCH, read_options=o
                )
                runs[name].append(throughput(make, batches[tok_name]))
        for name, rates in runs.items():
            wall = statistics.median(r[0] for r in rates)
            cpu = statistics.median(r[1] for r in rates)
            out[f"{tok_name}: {name}"] = {"tokens_per_sec": wall, "tokens_per_cpu_sec": cpu}
            print(
                f"read options {tok_name}: {name}: {wall:,.0f} tokens/s, {cpu:,.0f} tokens/CPU-s",
                flush=True,
            )
    return out


def bench_worker_transport(corpus, tokenizers, batches, group):
    """Grain's default (every array through a new shared memory segment) vs datalib's 1 MiB
    threshold (smaller arrays through the worker queue), same pipeline, 2 workers, paired."""
    out = {}
    for tok_name, tok in tokenizers.items():
        n = batches[tok_name]
        shm = lambda t=tok: grain_direct(corpus, t, 2, min_shm_size=0)
        queue = lambda t=tok: grain_direct(corpus, t, 2, min_shm_size=1 << 20)
        wall = paired_wall(shm, queue, group, rounds=2 * (n // group))
        cpu = [throughput(shm, n)[1], throughput(queue, n)[1]]
        out[tok_name] = {
            "shared_memory_tokens_per_sec": wall[0],
            "queue_tokens_per_sec": wall[1],
            "shared_memory_tokens_per_cpu_sec": cpu[0],
            "queue_tokens_per_cpu_sec": cpu[1],
        }
        print(
            f"transport {tok_name}: shm {wall[0]:,.0f} tokens/s {cpu[0]:,.0f}/CPU-s; "
            f"queue {wall[1]:,.0f} tokens/s {cpu[1]:,.0f}/CPU-s",
            flush=True,
        )
    return out


def section(title: str, header: str, alignment: str, rows: list[str]) -> list[str]:
    """The lines of one results.md section: its heading, then a table."""
    return ["", f"## {title}", "", header, alignment, *rows]


def write_markdown(results, path):
    lines = [
        "# datalib benchmark results",
        "",
        f"Run {results['date']} on {results['host']} ({results['cpus']} CPUs, Python "
        f"{results['python']}, grain {results['grain']}). Start-up (worker spawn, first reads) is "
        "excluded everywhere.",
        "",
        conditions_markdown(results["conditions"])
        if "conditions" in results
        else "Run conditions were not measured (this run predates benchmarks/conditions.py).",
        "",
        "## Packed, tokenized pipeline: datalib vs the same work written directly in Grain",
        "",
        f"Default corpus (train), first-fit packing, seq_len {SEQ_LEN}, batch {BATCH}. Tokens = "
        "non-padding positions. Overhead = Grain rate / datalib rate (target <= 1.10). Wall "
        "columns: both pipelines open side by side and pulled in alternating rounds of one "
        "packing group (32 batches), so the other jobs' load falls on both alike. CPU columns: "
        "tokens per CPU second of the main process and its worker processes (from /proc) over "
        f"separate runs, median of {results['trials']}; this is the measure least affected by "
        "the other work on the machine.",
        "",
        "| tokenizer | workers | Grain direct tokens/s | datalib tokens/s | overhead (wall) "
        "| Grain tokens/CPU-s | datalib tokens/CPU-s | overhead (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["overhead"]:
        lines.append(
            f"| {r['tokenizer']} | {r['workers']} | {r['grain_tokens_per_sec']:,.0f} | "
            f"{r['datalib_tokens_per_sec']:,.0f} | {r['overhead_wall']:.3f} | "
            f"{r['grain_tokens_per_cpu_sec']:,.0f} | {r['datalib_tokens_per_cpu_sec']:,.0f} | "
            f"{r['overhead_cpu']:.3f} |"
        )
    lines += section(
        f"Packing efficiency at seq_len {SEQ_LEN} (default corpus, byte tokens)",
        "| method | non-padding fraction |",
        "|---|---:|",
        [f"| {method} | {eff:.4f} |" for method, eff in results["packing_efficiency"].items()],
    )
    lines += section(
        "Grain ReadOptions of the random-access stage (whole pipeline, 0 workers)",
        "| tokenizer: read options | tokens/s | tokens/CPU-s |",
        "|---|---:|---:|",
        [
            f"| {name} | {r['tokens_per_sec']:,.0f} | {r['tokens_per_cpu_sec']:,.0f} |"
            for name, r in results["read_options"].items()
        ],
    )
    lines += section(
        "Worker output transport (2 workers, Grain pipeline above, paired wall / one CPU run)",
        "| tokenizer | shared memory for every array (Grain default) tokens/s | arrays < 1 MiB "
        "via queue (datalib default) tokens/s | shm tokens/CPU-s | queue tokens/CPU-s |",
        "|---|---:|---:|---:|---:|",
        [
            f"| {name} | {r['shared_memory_tokens_per_sec']:,.0f} | "
            f"{r['queue_tokens_per_sec']:,.0f} | {r['shared_memory_tokens_per_cpu_sec']:,.0f} | "
            f"{r['queue_tokens_per_cpu_sec']:,.0f} |"
            for name, r in results["worker_transport"].items()
        ],
    )
    lines.append("")
    path.write_text("\n".join(lines))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--markdown-only", action="store_true", help="rewrite results.md from results.json"
    )
    parser.add_argument(
        "--out", type=pathlib.Path, help="default: this folder (quick/ with --quick)"
    )
    args = parser.parse_args()
    if args.markdown_only:
        write_markdown(json.loads((HERE / "results.json").read_text()), HERE / "results.md")
        return 0
    trials = 1 if args.quick else args.trials
    corpus = dl.default_corpus("train")
    print("training a 4096-token BPE on ~2 MB of the corpus ...", flush=True)
    sample, size = [], 0
    for i in range(0, len(corpus), 4):
        sample.append(corpus[i])
        size += len(sample[-1])
        if size > 2_000_000:
            break
    tokenizers = {"byte": dl.ByteTokenizer(), "bpe": dl.BPETokenizer.train(sample, vocab_size=4096)}
    # First-fit emits rows in groups of num_packing_bins (256 rows = 32 batches): measure whole
    # multiples of a group, or the timing mostly sees rows packed before the clock started.
    group = 256 // BATCH
    batches = {"byte": group * (3 if args.quick else 12), "bpe": group * (1 if args.quick else 4)}
    with measure_conditions(packages=["grain", "numpy", "jaxstack-datalib"]) as conditions:
        results = {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "host": platform.node() or "unknown",
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grain": __import__("importlib.metadata").metadata.version("grain"),
            "trials": trials,
            "seq_len": SEQ_LEN,
            "batch_size": BATCH,
            "overhead": bench_overhead(corpus, tokenizers, trials, batches, group),
            "packing_efficiency": bench_packing(corpus, 20 if args.quick else 200),
            "read_options": bench_read_options(corpus, tokenizers, batches, trials),
            "worker_transport": bench_worker_transport(corpus, tokenizers, batches, group),
        }
    results["conditions"] = conditions.as_dict()
    out = args.out or (HERE / "quick" if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, out / "results.md")
    print(f"wrote {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
