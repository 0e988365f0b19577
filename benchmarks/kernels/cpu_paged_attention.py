"""Ragged paged attention on CPU: kernlib's XLA implementation against its custom call.

The serving engine's shapes on CPU (issue 31's d=256 model): 4 kv heads of 64, float32, a
head-major cache of 4 layers x 4,096 blocks of 16 positions, each sequence's blocks allocated
in order as the engine's block pool hands them out. One timed call runs all 4 layers (each its
own pages, as one engine step does); cases are decodes (`seqs` sequences of one new token at
`context` cached tokens) and prefill chunks (`rows` new tokens per sequence, ending at
`context`). The implementations alternate within each round; the table shows medians and the
ratio xla / ffi_cpu (> 1: the custom call is faster), with the run conditions.

    .venv/bin/python benchmarks/kernels/cpu_paged_attention.py --json out.json
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack import kernlib

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import conditions_markdown, measure_conditions

LAYERS, BLOCKS, PAGE, KV_HEADS, HEAD_DIM, TABLE_WIDTH = 4, 4096, 16, 4, 64, 128
IMPLEMENTATIONS = ("xla", "ffi_cpu")
# (kind, sequences, new tokens per sequence, context)
CASES = [
    ("decode", 1, 1, 192),
    ("decode", 8, 1, 192),
    ("decode", 32, 1, 192),
    ("decode", 8, 1, 2048),
    ("decode", 32, 1, 2048),
    ("prefill", 16, 128, 128),
    ("prefill", 1, 256, 256),
    ("prefill", 1, 256, 2048),
    ("prefill", 1, 2048, 2048),
]


def case_inputs(seqs: int, rows: int, context: int):
    rng = np.random.default_rng(0)
    shape = (KV_HEADS, LAYERS * BLOCKS, PAGE, HEAD_DIM)
    k = jnp.asarray(rng.standard_normal(shape, np.float32))
    v = jnp.asarray(rng.standard_normal(shape, np.float32))
    tables = 1 + np.arange(seqs * TABLE_WIDTH, dtype=np.int32).reshape(seqs, TABLE_WIDTH)
    q = jnp.asarray(rng.standard_normal((seqs * rows, KV_HEADS, HEAD_DIM), np.float32))
    kv_lens = jnp.full((seqs,), context, jnp.int32)
    starts = jnp.arange(seqs + 1, dtype=jnp.int32) * rows
    return q, k, v, kv_lens, jnp.asarray(tables), starts


def all_layers(implementation: str):
    """One step's attention: every layer's call, on that layer's pages of the one cache."""
    attend = functools.partial(
        kernlib.ragged_paged_attention, implementation=implementation, kv_layout="head_major"
    )

    def step(q, k, v, kv_lens, tables, starts):
        return [
            attend(q, k, v, kv_lens, tables + layer * BLOCKS, starts) for layer in range(LAYERS)
        ]

    return jax.jit(step)


def measure(case, rounds: int, calls: int) -> dict:
    kind, seqs, rows, context = case
    args = case_inputs(seqs, rows, context)
    steps = {name: all_layers(name) for name in IMPLEMENTATIONS}
    outs = {name: jax.block_until_ready(step(*args)) for name, step in steps.items()}
    error = max(float(jnp.abs(a - b).max()) for a, b in zip(*outs.values(), strict=True))
    times = {name: [] for name in steps}
    for r in range(rounds):
        order = IMPLEMENTATIONS if r % 2 == 0 else IMPLEMENTATIONS[::-1]
        for name in order:
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(steps[name](*args))
            times[name].append((time.perf_counter() - start) / calls * 1e3)
    ms = {name: statistics.median(t) for name, t in times.items()}
    settings = dict(kind=kind, seqs=seqs, rows_per_seq=rows, context=context)
    return {**settings, "ms": ms, "rounds_ms": times, "max_abs_difference": error}


def markdown(results: list[dict]) -> str:
    lines = [
        "| case | sequences | new tokens each | context | xla ms | ffi_cpu ms | xla / ffi_cpu |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        xla, ffi = r["ms"]["xla"], r["ms"]["ffi_cpu"]
        lines.append(
            f"| {r['kind']} | {r['seqs']} | {r['rows_per_seq']} | {r['context']} | {xla:.3f} | "
            f"{ffi:.3f} | {xla / ffi:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per round")
    parser.add_argument("--json")
    args = parser.parse_args()
    with measure_conditions(["jax", "jaxlib", "jaxstack-kernlib"]) as conditions:
        results = [measure(case, args.rounds, args.calls) for case in CASES]
    table = markdown(results)
    print(conditions_markdown(conditions.as_dict()))
    print(
        f"4 layers per call, {LAYERS * BLOCKS} blocks of {PAGE}, {KV_HEADS} kv heads of "
        f"{HEAD_DIM}, float32, head-major; medians of {args.rounds} rounds x {args.calls} calls"
    )
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            settings = dict(
                vars(args),
                layers=LAYERS,
                blocks=BLOCKS,
                page=PAGE,
                kv_heads=KV_HEADS,
                head_dim=HEAD_DIM,
                table_width=TABLE_WIDTH,
            )
            out = {"results": results, "settings": settings, "markdown": table}
            json.dump({**out, "conditions": conditions.as_dict()}, f, indent=1)


if __name__ == "__main__":
    main()
