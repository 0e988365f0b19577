"""optlib benchmarks: chunked vs naive cross-entropy memory, and recipe vs hand-written Optax.

1. Loss memory (the issue's acceptance check): for B=8, T=2048, V=128k (131072), d=2048, the
   compiled peak temporary memory (`jax.jit(f).lower(...).compile().memory_analysis()`) of
   jaxstack.optlib.chunked_cross_entropy_loss vs the naive loss (full [B, T, V] logits, then
   optax.softmax_cross_entropy_with_integer_labels, the Optax way). Compiled only, never run.
2. Loss time at a size this shared CPU runs quickly (B=2, T=256, V=16k, d=256): median wall time of
   value_and_grad, chunked vs naive.
3. Optimiser step time: build_optimizer's AdamW recipe vs the same chain hand-written in Optax
   on a ~10M-parameter tree (median of jitted steps): the recipe should cost nothing extra.

Writes results.json and results.md next to this script (under quick/ with --quick).

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/optlib/bench_optlib.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

import jaxstack.optlib as optlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conditions import conditions_markdown, measure_conditions

HERE = pathlib.Path(__file__).parent
GiB = 2**30


def naive_loss(h, w, y, m):
    logits = jnp.einsum("btd,dv->btv", h, w, preferred_element_type=jnp.float32)
    per_token = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return jnp.sum(per_token * m) / jnp.maximum(jnp.sum(m), 1.0)


def chunked_loss(h, w, y, m, chunk_size):
    return optlib.chunked_cross_entropy_loss(h, w, y, m, chunk_size=chunk_size)[0]


def loss_memory(b, t, v, d, dtype, mode, chunk_size):
    args = (
        jax.ShapeDtypeStruct((b, t, d), dtype),
        jax.ShapeDtypeStruct((d, v), dtype),
        jax.ShapeDtypeStruct((b, t), jnp.int32),
        jax.ShapeDtypeStruct((b, t), jnp.float32),
    )
    out = {}
    for name, fn in (
        ("naive", naive_loss),
        ("chunked", lambda *a: chunked_loss(*a, chunk_size=chunk_size)),
    ):
        f = fn if mode == "forward" else jax.value_and_grad(fn, argnums=(0, 1))
        start = time.perf_counter()
        analysis = jax.jit(f).lower(*args).compile().memory_analysis()
        out[name] = {
            "temp_bytes": int(analysis.temp_size_in_bytes),
            "argument_bytes": int(analysis.argument_size_in_bytes),
            "output_bytes": int(analysis.output_size_in_bytes),
            "compile_s": round(time.perf_counter() - start, 1),
        }
    out["ratio"] = out["naive"]["temp_bytes"] / max(out["chunked"]["temp_bytes"], 1)
    return out


def median_time(fn, *args, repeats):
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def loss_time(b, t, v, d, chunk_size, repeats):
    k = jax.random.split(jax.random.key(0), 3)
    h = jax.random.normal(k[0], (b, t, d))
    w = jax.random.normal(k[1], (d, v)) * d**-0.5
    y = jax.random.randint(k[2], (b, t), 0, v)
    m = jnp.ones((b, t))
    naive = jax.jit(jax.value_and_grad(naive_loss, argnums=(0, 1)))
    chunked = jax.jit(jax.value_and_grad(lambda *a: chunked_loss(*a, chunk_size), argnums=(0, 1)))
    l1, l2 = float(naive(h, w, y, m)[0]), float(chunked(h, w, y, m)[0])
    assert abs(l1 - l2) < 1e-4 * abs(l1), (l1, l2)
    return {
        "naive_s": median_time(naive, h, w, y, m, repeats=repeats),
        "chunked_s": median_time(chunked, h, w, y, m, repeats=repeats),
    }


def optimizer_time(repeats):
    d, layers = 256, 8
    keys = iter(jax.random.split(jax.random.key(1), 8 * layers + 2))
    params = {
        "embed": {"embedding": jax.random.normal(next(keys), (8192, d))},
        "lm_head": {"kernel": jax.random.normal(next(keys), (d, 8192))},
    }
    for i in range(layers):
        params[f"layers/{i}"] = {
            "attn": {
                "qkv": {"kernel": jax.random.normal(next(keys), (d, 3 * d))},
                "o": {"kernel": jax.random.normal(next(keys), (d, d))},
            },
            "mlp": {
                "up": {"kernel": jax.random.normal(next(keys), (d, 4 * d))},
                "down": {"kernel": jax.random.normal(next(keys), (4 * d, d))},
            },
            "norm": {"scale": jnp.ones(d)},
        }
    n_params = sum(x.size for x in jax.tree.leaves(params))
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-4, 100, 1000, 0.0)
    mask = jax.tree_util.tree_map_with_path(
        lambda kp, _: not any(s in str(kp) for s in ("norm", "embed")), params
    )
    hand = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.95, weight_decay=0.1, mask=mask)
    )
    recipe = optlib.build_optimizer(
        optlib.OptimizerConfig(
            name="adamw",
            learning_rate=3e-4,
            b2=0.95,
            weight_decay=0.1,
            clip_norm=1.0,
            schedule={"name": "warmup_cosine", "warmup_steps": 100, "total_steps": 1000},
        ),
        params,
    )
    grads = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)
    out = {"num_params": n_params}
    for name, tx in (("hand_written_optax", hand), ("optlib_recipe", recipe)):
        step = jax.jit(lambda g, s, p, tx=tx: tx.update(g, s, p))
        out[f"{name}_s"] = median_time(step, grads, tx.init(params), params, repeats=repeats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    parser.add_argument(
        "--out", type=pathlib.Path, help="default: this folder (quick/ with --quick)"
    )
    args = parser.parse_args()
    with measure_conditions(packages=["jax", "jaxlib", "optax", "jaxstack-optlib"]) as conditions:
        results = run(args.quick)
    results["conditions"] = conditions.as_dict()
    out = args.out or (HERE / "quick" if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))


def run(quick: bool) -> dict:
    big = (1, 512, 32768, 512) if quick else (8, 2048, 131072, 2048)
    chunk_size = 1024
    results = {
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "jax": jax.__version__,
            "optax": optax.__version__,
            "backend": jax.default_backend(),
        },
        "loss_memory": [],
    }
    b, t, v, d = big
    for dtype in (jnp.float32, jnp.bfloat16):
        for mode in ("forward", "value_and_grad"):
            row = {
                "B": b,
                "T": t,
                "V": v,
                "d": d,
                "dtype": jnp.dtype(dtype).name,
                "mode": mode,
                "chunk_size": chunk_size,
                **loss_memory(b, t, v, d, dtype, mode, chunk_size),
            }
            print(json.dumps(row))
            results["loss_memory"].append(row)
    repeats = 3 if quick else 5
    b, t, v, d, chunk = 2, 256, 16384, 256, 128
    results["loss_time"] = {
        "B": b,
        "T": t,
        "V": v,
        "d": d,
        "chunk_size": chunk,
        "repeats": repeats,
        **loss_time(b, t, v, d, chunk, repeats),
    }
    print(json.dumps(results["loss_time"]))
    results["optimizer_time"] = {"repeats": 20, **optimizer_time(20)}
    print(json.dumps(results["optimizer_time"]))
    return results


def markdown(r: dict) -> str:
    lines = [
        "# optlib benchmark results",
        "",
        f"Machine: {r['machine']['platform']}, {r['machine']['cpu_count']} CPUs, backend "
        f"{r['machine']['backend']}, jax {r['machine']['jax']}, optax {r['machine']['optax']}.",
        "",
        conditions_markdown(r["conditions"])
        if "conditions" in r
        else f"Run conditions were not measured (this run predates benchmarks/conditions.py); "
        f"noted by hand at the time: {r['machine'].get('note', 'nothing')}.",
        "",
        "## Cross-entropy peak temporary memory (compiled, `memory_analysis`)",
        "",
        "Naive: full `[B, T, V]` float32 logits then `optax.softmax_cross_entropy_with_integer_"
        "labels`. Chunked: `jaxstack.optlib.chunked_cross_entropy_loss`.",
        "",
        "| B | T | V | d | dtype | mode | chunk | naive temp (GiB) | chunked temp (GiB) | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["loss_memory"]:
        lines.append(
            f"| {row['B']} | {row['T']} | {row['V']} | {row['d']} | {row['dtype']} | "
            f"{row['mode']} | {row['chunk_size']} | {row['naive']['temp_bytes'] / GiB:.2f} | "
            f"{row['chunked']['temp_bytes'] / GiB:.2f} | {row['ratio']:.1f}x |"
        )
    lt = r["loss_time"]
    ot = r["optimizer_time"]
    lines += [
        "",
        f"## Loss value_and_grad time (B={lt['B']}, T={lt['T']}, V={lt['V']}, d={lt['d']}, "
        f"chunk {lt['chunk_size']}, float32, median of {lt['repeats']})",
        "",
        "| naive (s) | chunked (s) | chunked / naive |",
        "|---|---|---|",
        f"| {lt['naive_s']:.3f} | {lt['chunked_s']:.3f} | {lt['chunked_s'] / lt['naive_s']:.2f} |",
        "",
        f"## Optimiser update time (AdamW + clip + mask + warmup-cosine, {ot['num_params']:,} "
        f"params, jitted, median of {ot['repeats']})",
        "",
        "| hand-written Optax (ms) | optlib recipe (ms) | recipe / hand-written |",
        "|---|---|---|",
        f"| {ot['hand_written_optax_s'] * 1e3:.1f} | {ot['optlib_recipe_s'] * 1e3:.1f} | "
        f"{ot['optlib_recipe_s'] / ot['hand_written_optax_s']:.2f} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
