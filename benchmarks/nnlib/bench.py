"""nnlib CPU benchmark: dispatch overhead of as_function, and fwd+bwd vs HF transformers (torch).

    .venv/bin/python benchmarks/nnlib/bench.py --torch-python /tmp/torchvenv/bin/python
    .venv/bin/python benchmarks/nnlib/bench.py --quick     # batch 2 x 64, few steps, into quick/

Part 1 (overhead) times one jitted SGD train step of the tiny model three ways: through
`nnlib.as_function` + `jax.jit`, plain `jax.jit` over a hand-made `nnx.split` state, and
Flax's graph-mode `nnx.jit` (for reference). Part 2 times forward+backward of a cross-entropy
loss for the tiny model and a d=512 model, nnlib (jax.jit) and HF LlamaForCausalLM (torch,
eager, float32) on the same dims, in the same run (bench_torch.py in the torch venv). Medians.
Writes results.json and results.md next to this file (under quick/ with --quick).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxstack import nnlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conditions import conditions_markdown, measure_conditions

HERE = pathlib.Path(__file__).parent
MODELS = {
    "tiny": nnlib.get_preset("tiny"),
    "d512": nnlib.get_preset("tiny").replace(
        d_model=512, num_heads=8, num_kv_heads=8, mlp_dim=2048
    ),
}


def median_time(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def make_batch(config, b, t):
    key = jax.random.key(0)
    tokens = jax.random.randint(key, (b, t), 0, config.vocab_size, jnp.int32)
    return tokens, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))


def loss_of(logits, tokens):
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def overhead(b, t, iters):
    config = MODELS["tiny"]
    tokens, positions = make_batch(config, b, t)
    model = nnlib.Transformer(config, rngs=nnx.Rngs(0))

    apply, params = nnlib.as_function(model)

    @jax.jit
    def step_as_function(params):
        loss, g = jax.value_and_grad(lambda p: loss_of(apply(p, tokens, positions)[0], tokens))(
            params
        )
        return loss, jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)

    graphdef, state = nnx.split(model)

    @jax.jit
    def step_plain(state):
        def f(s):
            return loss_of(nnx.merge(graphdef, s)(tokens, positions)[0], tokens)

        loss, g = jax.value_and_grad(f)(state)
        return loss, jax.tree.map(lambda p, g: p - 1e-3 * g, state, g)

    graph_model = nnlib.Transformer(config, rngs=nnx.Rngs(0))

    @nnx.jit
    def step_graph(model):
        def f(m):
            return loss_of(m(tokens, positions)[0], tokens)

        loss, g = nnx.value_and_grad(f)(model)
        nnx.update(model, jax.tree.map(lambda p, g: p - 1e-3 * g, nnx.state(model, nnx.Param), g))
        return loss

    holder = {"p": params, "s": state}

    def run_af():
        _, holder["p"] = step_as_function(holder["p"])
        return holder["p"]

    def run_plain():
        _, holder["s"] = step_plain(holder["s"])
        return holder["s"]

    paths = {
        "as_function + jax.jit": run_af,
        "jax.jit over nnx.split state": run_plain,
        "nnx.jit (graph mode)": lambda: step_graph(graph_model),
    }
    # Interleave the paths round by round, so load changes on the shared machine hit all alike.
    times = {k: [] for k in paths}
    for _ in range(2):
        for fn in paths.values():
            jax.block_until_ready(fn())
    for _ in range(iters):
        for k, fn in paths.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def nnlib_fwd_bwd(name, b, t, iters):
    config = MODELS[name]
    tokens, positions = make_batch(config, b, t)
    apply, params = nnlib.as_function(nnlib.Transformer(config, rngs=nnx.Rngs(0)))
    grad = jax.jit(jax.value_and_grad(lambda p: loss_of(apply(p, tokens, positions)[0], tokens)))
    return median_time(lambda: grad(params), 2, iters)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch-python", default="/tmp/torchvenv/bin/python")
    parser.add_argument("--quick", action="store_true", help="small sizes and few steps")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--overhead-batch", type=int, default=2)
    parser.add_argument("--overhead-seq", type=int, default=64)
    parser.add_argument("--overhead-iters", type=int, default=21)
    parser.add_argument(
        "--skip-fwd-bwd",
        action="store_true",
        help="keep the fwd+bwd rows of the previous results.json",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, help="default: this folder (quick/ with --quick)"
    )
    args = parser.parse_args()
    if args.quick:
        args.batch, args.seq, args.iters, args.overhead_iters = 2, 64, 3, 7
    versions = ["jax", "jaxlib", "flax", "jaxstack-nnlib"]
    with measure_conditions(packages=versions) as conditions:
        out = measure(args)
    out["conditions"] = conditions.as_dict()
    write(out, args, args.out or (HERE / "quick" if args.quick else HERE))


def measure(args: argparse.Namespace) -> dict:
    b, t = args.batch, args.seq
    out = {
        "batch": b,
        "seq_len": t,
        "iters": args.iters,
        "jax": jax.__version__,
        "machine": f"{platform.machine()}, {jax.device_count()} CPU device(s)",
    }
    ob, ot = args.overhead_batch, args.overhead_seq
    out["overhead_batch"], out["overhead_seq_len"] = ob, ot
    out["overhead_tiny_train_step_s"] = overhead(ob, ot, args.overhead_iters)
    rows = []
    previous = HERE / "results.json"
    if args.skip_fwd_bwd and previous.exists():
        rows = json.loads(previous.read_text())["fwd_bwd"]
    for name, config in MODELS.items() if not rows else ():
        jx = nnlib_fwd_bwd(name, b, t, args.iters)
        cmd = [
            args.torch_python,
            str(HERE / "bench_torch.py"),
            json.dumps(config.to_dict()),
            str(b),
            str(t),
            str(args.iters),
        ]
        torch_res = json.loads(
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        rows.append(
            {
                "model": name,
                "d_model": config.d_model,
                "layers": config.num_layers,
                "nnlib_s": jx,
                "hf_torch_s": torch_res["median_s"],
                "hf_over_nnlib": torch_res["median_s"] / jx,
                "tokens_per_s_nnlib": b * t / jx,
                "tokens_per_s_hf": b * t / torch_res["median_s"],
                "torch": torch_res["torch"],
                "transformers": torch_res["transformers"],
            }
        )
    out["fwd_bwd"] = rows
    return out


def write(out: dict, args: argparse.Namespace, folder: pathlib.Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(out, indent=2))
    b, t, rows = out["batch"], out["seq_len"], out["fwd_bwd"]
    ob, ot = out["overhead_batch"], out["overhead_seq_len"]
    o = out["overhead_tiny_train_step_s"]
    base = o["jax.jit over nnx.split state"]
    lines = [
        "# nnlib benchmark results",
        "",
        f"CPU, batch {b} x seq {t}, float32, medians of {args.iters} steps after 2 warm-ups; "
        f"jax {out['jax']}.",
        "",
        conditions_markdown(out["conditions"]),
        "",
        f"## Train-step dispatch overhead (tiny model, SGD step, batch {ob} x seq {ot}, "
        f"paths interleaved, median of {args.overhead_iters})",
        "",
        "| path | median step (ms) | vs plain jax.jit |",
        "|---|---|---|",
    ]
    for k, v in o.items():
        lines.append(f"| {k} | {v * 1e3:.1f} | {v / base:.2f}x |")
    lines += [
        "",
        "## Forward+backward vs HF transformers (torch CPU, eager)",
        "",
        "| model | d_model | layers | nnlib (ms) | HF torch (ms) | HF / nnlib "
        "| nnlib tok/s | HF tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['d_model']} | {r['layers']} | {r['nnlib_s'] * 1e3:.0f} | "
            f"{r['hf_torch_s'] * 1e3:.0f} | {r['hf_over_nnlib']:.2f} | "
            f"{r['tokens_per_s_nnlib']:.0f} | {r['tokens_per_s_hf']:.0f} |"
        )
    lines += ["", f"HF side: torch {rows[0]['torch']}, transformers {rows[0]['transformers']}."]
    (folder / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
