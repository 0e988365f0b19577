"""kernlib kernels against their peers: one script, sized for a GPU runner with a short budget.

    python benchmarks/kernels/run.py                 # GPU: seq 2k/8k/16k, decode 64/256 seqs
    python benchmarks/kernels/run.py --tiny          # CPU smoke run (what CI and tests run)

Attention forward+backward (bfloat16, causal, GQA) times kernlib's `xla` reference, kernlib's
Pallas kernel (`pallas_triton` on GPU, `pallas_mosaic_tpu` on TPU), kernlib's own choice
(`implementation=None`) and `jax.nn.dot_product_attention(implementation="cudnn")`
(GPU only). Ragged paged attention decode throughput (tokens/s) compares kernlib's `xla`
reference with the Pallas kernel. Medians over --repeats runs after warm-up; each case is
skipped once --budget-s is spent. Writes results.md and results.json next to this file
(or to --out).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform as py_platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxstack import kernlib
from jaxstack.kernlib.ops.ragged_paged_attention import base as rpa_base

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conditions import conditions_markdown, measure_conditions

HERE = Path(__file__).resolve().parent
PALLAS = {"gpu": "pallas_triton", "tpu": "pallas_mosaic_tpu"}


def platform() -> str:
    """'cpu', 'gpu' or 'tpu' for JAX's default backend (CUDA and ROCm are both 'gpu')."""
    name = jax.devices()[0].platform
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


def median_ms(fn, args, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def attention_fwd_bwd(attn):
    def loss(q, k, v):
        return jnp.sum(attn(q, k, v).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def attention_contenders(plat: str) -> dict:
    out = {
        "kernlib xla (reference)": functools.partial(kernlib.attention, implementation="xla"),
        "kernlib implementation=None": kernlib.attention,
    }
    if plat in PALLAS:
        out[f"kernlib {PALLAS[plat]}"] = functools.partial(
            kernlib.attention, implementation=PALLAS[plat]
        )
    if plat == "gpu":
        out["jax.nn.dot_product_attention cudnn"] = functools.partial(
            jax.nn.dot_product_attention, is_causal=True, implementation="cudnn"
        )
    else:
        out["jax.nn.dot_product_attention xla"] = functools.partial(
            jax.nn.dot_product_attention, is_causal=True, implementation="xla"
        )
    return out


def bench_attention(seqs, heads, kv_heads, head_dim, repeats, deadline, plat):
    rows = []
    for t in seqs:
        ks = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(ks[0], (1, t, heads, head_dim), jnp.bfloat16)
        k = jax.random.normal(ks[1], (1, t, kv_heads, head_dim), jnp.bfloat16)
        v = jax.random.normal(ks[2], (1, t, kv_heads, head_dim), jnp.bfloat16)
        # causal forward = 2 matmuls over half the square; backward ~2.5x forward
        flops = 3.5 * 4 * t * t * heads * head_dim / 2
        chosen = kernlib.which_implementation("attention", q, k, v)[0]
        for name, attn in attention_contenders(plat).items():
            row = {"bench": "attention fwd+bwd", "seq": t, "contender": name}
            if time.perf_counter() > deadline:
                row["status"] = "skipped (time budget)"
            else:
                try:
                    ms = median_ms(attention_fwd_bwd(attn), (q, k, v), repeats)
                    row.update(median_ms=round(ms, 3), tflops=round(flops / ms / 1e9, 2))
                    row["status"] = "ok"
                except Exception as e:  # OOM at 16k for the reference, cuDNN unavailable, ...
                    row["status"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
            if name == "kernlib implementation=None":
                row["contender"] = f"{name} (-> {chosen})"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def bench_decode(batches, context, heads, kv_heads, head_dim, repeats, deadline, plat):
    rows = []
    impls = ["xla"] + ([PALLAS[plat]] if plat in PALLAS else [])
    for seqs in batches:
        args, _ = rpa_base.example(
            {
                "seqs": seqs,
                "context": context,
                "heads": heads,
                "kv_heads": kv_heads,
                "head_dim": head_dim,
                "page_size": 16,
            },
            "bfloat16",
        )
        for impl in impls:
            row = {
                "bench": "ragged paged attention decode",
                "seqs": seqs,
                "context": context,
                "contender": f"kernlib {impl}" + (" (reference)" if impl == "xla" else ""),
            }
            if time.perf_counter() > deadline:
                row["status"] = "skipped (time budget)"
            else:
                fn = jax.jit(functools.partial(kernlib.ragged_paged_attention, implementation=impl))
                try:
                    ms = median_ms(fn, args, repeats)
                    row.update(
                        median_ms=round(ms, 3), tokens_per_s=round(seqs / ms * 1e3, 1), status="ok"
                    )
                except Exception as e:
                    row["status"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def with_ratios(rows, key, baseline_prefix="kernlib xla"):
    """Adds `vs_reference`: reference time / contender time (>1 = faster than the reference)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["bench"], r.get("seq"), r.get("seqs")), []).append(r)
    for group in groups.values():
        base = next((r for r in group if r["contender"].startswith(baseline_prefix)), None)
        for r in group:
            if base and "median_ms" in base and "median_ms" in r:
                r["vs_reference"] = round(base["median_ms"] / r["median_ms"], 2)
    return rows


def markdown(meta, rows) -> str:
    lines = [
        "# kernlib kernel benchmarks",
        "",
        f"Device: **{meta['device_kind']}** ({meta['platform']}), jax {meta['jax']}, "
        f"{meta['date']}, mode `{meta['mode']}`, {meta['repeats']} timed repeats (median).",
        "",
        conditions_markdown(meta["conditions"])
        if "conditions" in meta
        else "Run conditions were not measured (this run predates benchmarks/conditions.py).",
        "",
    ]
    if meta["platform"] == "cpu":
        lines += [
            "> CPU smoke run with tiny sizes: these numbers only show that the script runs end",
            "> to end. **GPU numbers are not measured yet.** On CPU",
            "> `implementation=None` runs the XLA reference (Pallas interpret mode is for tests).",
            "",
        ]
    lines += [
        "## Attention forward+backward (bfloat16, causal)",
        "",
        f"Shape: batch 1, {meta['heads']} query heads, {meta['kv_heads']} kv heads, head_dim "
        f"{meta['head_dim']}. vs ref = XLA reference time / contender time.",
        "",
        "| seq | contender | median ms | TFLOP/s | vs ref | status |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["bench"].startswith("attention"):
            lines.append(
                f"| {r['seq']} | {r['contender']} | {r.get('median_ms', '')} | "
                f"{r.get('tflops', '')} | {r.get('vs_reference', '')} | {r['status']} |"
            )
    lines += [
        "",
        "## Ragged paged attention, decode (one new token per sequence, bfloat16)",
        "",
        f"Context {meta['context']} tokens per sequence, page size 16, pages shuffled.",
        "",
        "| sequences | contender | median ms | tokens/s | vs ref | status |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["bench"].startswith("ragged"):
            lines.append(
                f"| {r['seqs']} | {r['contender']} | {r.get('median_ms', '')} | "
                f"{r.get('tokens_per_s', '')} | {r.get('vs_reference', '')} | {r['status']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU-sized smoke run")
    parser.add_argument("--seqs", default=None, help="attention lengths (default 2048,8192,16384)")
    parser.add_argument("--decode-batches", default=None, help="default 64,256")
    parser.add_argument("--context", type=int, default=None, help="decode context (default 4096)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args(argv)
    plat = platform()
    tiny = args.tiny
    seqs = [int(s) for s in (args.seqs or ("128,256" if tiny else "2048,8192,16384")).split(",")]
    batches = [int(s) for s in (args.decode_batches or ("4,8" if tiny else "64,256")).split(",")]
    context = args.context or (256 if tiny else 4096)
    repeats = args.repeats or (3 if tiny else 10)
    heads, kv_heads, head_dim = (4, 2, 64) if tiny else (16, 4, 128)
    dec_heads, dec_kv, dec_dim = (4, 2, 64) if tiny else (32, 8, 128)
    deadline = time.perf_counter() + args.budget_s
    meta = {
        "device_kind": jax.devices()[0].device_kind,
        "platform": plat,
        "jax": jax.__version__,
        "python": py_platform.python_version(),
        "mode": "tiny" if tiny else "full",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "repeats": repeats,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "context": context,
        "cpu_count": os.cpu_count(),
    }
    with measure_conditions(packages=["jax", "jaxlib", "jaxstack-kernlib"]) as conditions:
        rows = bench_attention(seqs, heads, kv_heads, head_dim, repeats, deadline, plat)
        rows += bench_decode(batches, context, dec_heads, dec_kv, dec_dim, repeats, deadline, plat)
    meta["conditions"] = conditions.as_dict()
    rows = with_ratios(rows, "median_ms")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (out / "results.md").write_text(markdown(meta, rows))
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
