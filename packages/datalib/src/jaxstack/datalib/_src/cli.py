"""`jaxstack-data`: look at a pipeline's output (inspect), its data (stats), and its speed (bench).

jaxstack-data inspect --seq-len 256 --samples 2
jaxstack-data stats --source 'data/*.jsonl' --field text --tokenizer tok/tokenizer.json
jaxstack-data bench --seq-len 1024 --batch-size 8 --workers 2 --batches 200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import jaxstack.datalib as dl
from jaxstack.datalib._src.errors import Error
from jaxstack.datalib._src.packing_methods import PACKING_METHODS

_FORMATS = ("auto", "text", "lines", "jsonl", "parquet", "arrayrecord")


def _source(args) -> Any:
    if args.source == "default":
        return dl.default_corpus(args.split)
    fmt = args.format
    if fmt == "auto":
        name = args.source.rstrip("*")
        fmt = next(
            (
                f
                for ext, f in (
                    (".jsonl", "jsonl"),
                    (".parquet", "parquet"),
                    (".array_record", "arrayrecord"),
                    (".arrayrecord", "arrayrecord"),
                )
                if name.endswith(ext)
            ),
            "text",
        )
    if fmt == "text":
        return dl.TextSource(args.source, unit="file", on_error=args.on_error)
    if fmt == "lines":
        return dl.TextSource(args.source, unit="line", on_error=args.on_error)
    if fmt == "jsonl":
        return dl.JsonlSource(args.source, field=args.field, on_error=args.on_error)
    if fmt == "parquet":
        return dl.ParquetSource(args.source, column=args.field)
    return dl.ArrayRecordSource(args.source, on_error=args.on_error)


def _tokenizer(args) -> dl.Tokenizer:
    return (
        dl.ByteTokenizer()
        if args.tokenizer == "byte"
        else dl.BPETokenizer.from_file(args.tokenizer)
    )


def _batches(args, source, tokenizer, **overrides) -> dl.LMBatchIterator:
    kw = dict(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        seed=args.seed,
        packing=args.packing,
        num_workers=getattr(args, "workers", 0),
    )
    kw.update(overrides)
    return dl.lm_batches(source, tokenizer, **kw)


def cmd_inspect(args) -> dict:
    import numpy as np  # here, not at the top: `--help` answers without loading NumPy

    source, tokenizer = _source(args), _tokenizer(args)
    batches = []
    with _batches(args, source, tokenizer) as it:
        for _ in range(args.batches):
            batches.append(next(it))
    efficiency = dl.packing_efficiency(batches)
    row = {k: v[0] for k, v in batches[0].items()}
    if not args.json:
        print(f"source: {source!r}\ntokenizer: {tokenizer!r}")
        for seg in np.unique(row["segment_ids"][row["segment_ids"] > 0])[: args.samples]:
            where = row["segment_ids"] == seg
            text = tokenizer.decode(row["tokens"][where])
            print(
                f"--- segment {seg}: {int(where.sum())} tokens, starts at position "
                f"{int(row['positions'][where][0])} ---"
            )
            print(text[: args.chars] + ("..." if len(text) > args.chars else ""))
        print(f"--- packing efficiency over {len(batches)} batches: {efficiency:.2%}")
    return {
        "packing_efficiency": efficiency,
        "batches": len(batches),
        "segments_in_first_row": int(row["segment_ids"].max()),
    }


def cmd_stats(args) -> dict:
    import numpy as np

    source, tokenizer = _source(args), _tokenizer(args)
    n = len(source) if args.max_docs is None else min(len(source), args.max_docs)
    lengths, empty = [], 0
    for i in range(n):
        doc = source[i]
        if doc is None or (isinstance(doc, str) and not doc):
            empty += 1
            continue
        ids = doc["tokens"] if isinstance(doc, dict) else dl.tokenize_text(tokenizer, doc)
        lengths.append(len(ids))
    if not lengths:
        raise dl.EmptySourceError("no non-empty documents among those read")
    arr = np.asarray(lengths)
    edges = [0] + [2**k for k in range(4, 21)] + [np.inf]
    hist, _ = np.histogram(arr, bins=edges)
    buckets = [(int(edges[i]), edges[i + 1], int(c)) for i, c in enumerate(hist) if c]
    out = {
        "documents": len(arr),
        "empty_or_skipped": int(empty + getattr(source, "skipped", 0)),
        "tokens": int(arr.sum()),
        "mean": float(arr.mean()),
        "median": float(np.median(arr)),
        "p90": float(np.percentile(arr, 90)),
        "max": int(arr.max()),
        "histogram": [
            {"from": lo, "below": None if hi == np.inf else int(hi), "count": c}
            for lo, hi, c in buckets
        ],
    }
    if not args.json:
        print(f"source: {source!r}\ntokenizer: {tokenizer!r}")
        for key in ("documents", "empty_or_skipped", "tokens", "mean", "median", "p90", "max"):
            print(
                f"{key:>17}: {out[key]:,.1f}"
                if isinstance(out[key], float)
                else f"{key:>17}: {out[key]:,}"
            )
        top = max(c for _, _, c in buckets)
        for lo, hi, c in buckets:
            label = f"[{lo}, {'inf' if hi == np.inf else int(hi)})"
            print(f"{label:>18} {c:7d} {'#' * max(1, round(40 * c / top))}")
    return out


def cmd_bench(args) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    source, tokenizer = _source(args), _tokenizer(args)
    tokens = 0
    with _batches(args, source, tokenizer) as it:
        next(it)  # start-up (worker spawn) is not throughput
        start = time.perf_counter()
        columns = (
            TextColumn("bench"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, disable=args.json, transient=False) as bar:
            task = bar.add_task("bench", total=args.batches, rate="")
            for i in range(args.batches):
                batch = next(it)
                tokens += int(batch["segment_ids"].astype(bool).sum())
                if i % 10 == 9 or i == args.batches - 1:
                    rate = tokens / (time.perf_counter() - start)
                    bar.update(task, completed=i + 1, rate=f"{rate:,.0f} tokens/s")
        elapsed = time.perf_counter() - start
    out = {
        "batches": args.batches,
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_sec": tokens / elapsed,
        "workers": args.workers,
    }
    if not args.json:
        print(
            f"{tokens:,} tokens in {elapsed:.2f} s: {tokens / elapsed:,.0f} tokens/s "
            f"({args.workers} workers)"
        )
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxstack-data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (
        ("inspect", cmd_inspect, "decoded samples and packing efficiency"),
        ("stats", cmd_stats, "documents, tokens, length histogram"),
        ("bench", cmd_bench, "pipeline throughput with a progress bar"),
    ):
        s = sub.add_parser(name, help=help_)
        s.set_defaults(fn=fn)
        s.add_argument(
            "--source", default="default", help="'default' (the stdlib corpus) or a path/glob"
        )
        s.add_argument("--split", default="train", choices=("train", "validation"))
        s.add_argument("--format", default="auto", choices=_FORMATS)
        s.add_argument("--field", default="text", help="JSONL field / Parquet column")
        s.add_argument("--on-error", default="raise", choices=("raise", "skip"))
        s.add_argument("--tokenizer", default="byte", help="'byte' or a tokenizer.json path")
        s.add_argument("--json", action="store_true", help="print one JSON object only")
        if name != "stats":
            s.add_argument("--seq-len", type=int, default=1024)
            s.add_argument("--batch-size", type=int, default=8)
            s.add_argument("--packing", default="first_fit", choices=PACKING_METHODS)
            s.add_argument("--seed", type=int, default=0)
    ins = sub.choices["inspect"]
    ins.add_argument("--batches", type=int, default=16, help="batches for the efficiency")
    ins.add_argument("--samples", type=int, default=3)
    ins.add_argument("--chars", type=int, default=300)
    sub.choices["stats"].add_argument("--max-docs", type=int, default=None)
    bench = sub.choices["bench"]
    bench.add_argument("--batches", type=int, default=200)
    bench.add_argument("--workers", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = args.fn(args)
    except Error as e:
        print(f"jaxstack-data {args.command}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
