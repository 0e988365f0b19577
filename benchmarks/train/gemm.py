"""benchmarks/train/gemm.py: XLA:CPU's matmuls against PyTorch's at the train step's own shapes.

The minimal reproduction behind benchmarks/train: if jaxstack-train is slower than the PyTorch
trainers on a CPU kind, is it XLA's matrix-multiply kernels? Every matmul of one training step of
the benchmark's Llama (batch 8 x 256 tokens, 4 layers; d256 or d512) is timed alone, in jax and
in torch, with the operands laid out as the step has them: the forward product, and the two
backward products (input gradient `dY @ W^T` and weight gradient `X^T @ dY`) that read one
operand transposed. Attention's batched products (scores and weighted values, per batch x head)
are included. Both frameworks get the same shapes and fp32, torch with as many threads as the
machine has cores (JAX uses all cores by default).

    .venv/bin/python benchmarks/train/gemm.py --torch /tmp/torchvenv/bin/python --cases d256,d512

Rounds alternate jax and torch worker processes (jax, torch, then torch, jax, ...) so load that
drifts hits both alike. Per matmul: the median time over repeats and rounds, GFLOP/s and the
jax / torch speed ratio; per case: the total matmul time of one step (each product times its
count), which is the part of the step XLA's kernels decide. With `--steps N` (default 30) each round
also times both whole trainers (jaxstack-train with `train.matmul_backend=default`, so `XLA_FLAGS`
set around the script decides its kernels, and the minimal PyTorch trainer; both with glibc's
retained-memory settings), and the results split each step into its matmuls and the rest: how
much of the step is left to the elementwise work once the kernels are equal, and what a given
speed-up over PyTorch would leave for it. Writes results-gemm-<machine kind>.md and .json
(`--name` keeps a run apart: results-gemm-<name>-<machine kind>).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
LAYERS, BATCH, SEQ, HEAD_DIM, VOCAB = 4, 8, 256, 64, 4096


def step_matmuls(d_model: int, heads: int, mlp: int) -> list[dict]:
    """(name, batch, m, k, n, which operand is transposed, count per step) of one train step."""
    m = BATCH * SEQ
    projections = [  # name, in, out, count per step
        ("q/k/v/o proj", d_model, d_model, 4 * LAYERS),
        ("gate/up proj", d_model, mlp, 2 * LAYERS),
        ("down proj", mlp, d_model, LAYERS),
        ("lm head", d_model, VOCAB, 1),
    ]
    out = []
    for name, k, n, count in projections:
        out += [
            dict(name=f"{name} fwd", b=1, m=m, k=k, n=n, trans="", count=count),
            dict(name=f"{name} dX", b=1, m=m, k=n, n=k, trans="b", count=count),
            dict(name=f"{name} dW", b=1, m=k, k=m, n=n, trans="a", count=count),
        ]
    bh = BATCH * heads
    out += [
        dict(name="attn scores fwd", b=bh, m=SEQ, k=HEAD_DIM, n=SEQ, trans="b", count=LAYERS),
        dict(name="attn values fwd", b=bh, m=SEQ, k=SEQ, n=HEAD_DIM, trans="", count=LAYERS),
    ]
    return out


# run.py's cases, restated: the torch worker runs in a venv without jaxstack, which run.py needs.
CASES = {
    "d256": dict(d_model=256, heads=4, mlp=1024),
    "d512": dict(d_model=512, heads=8, mlp=2048),
}


def operand_shapes(g: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    a = (g["k"], g["m"]) if "a" in g["trans"] else (g["m"], g["k"])
    b = (g["n"], g["k"]) if "b" in g["trans"] else (g["k"], g["n"])
    lead = (g["b"],) if g["b"] > 1 else ()
    return lead + a, lead + b


def time_jax(matmuls: list[dict], repeats: int) -> list[float]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    times = []
    for g in matmuls:
        sa, sb = operand_shapes(g)
        a = jnp.asarray(np.random.default_rng(0).standard_normal(sa), jnp.float32)
        b = jnp.asarray(np.random.default_rng(1).standard_normal(sb), jnp.float32)
        batch = ((0,), (0,)) if g["b"] > 1 else ((), ())
        ca = len(sa) - 2 if "a" in g["trans"] else len(sa) - 1
        cb = len(sb) - 1 if "b" in g["trans"] else len(sb) - 2
        f = jax.jit(
            functools.partial(jax.lax.dot_general, dimension_numbers=(((ca,), (cb,)), batch))
        )
        f(a, b).block_until_ready()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            f(a, b).block_until_ready()
            ts.append(time.perf_counter() - t)
        times.append(statistics.median(ts))
    return times


def time_torch(matmuls: list[dict], repeats: int) -> list[float]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    times = []
    for g in matmuls:
        sa, sb = operand_shapes(g)
        a, b = torch.randn(sa), torch.randn(sb)
        a = a.transpose(-1, -2) if "a" in g["trans"] else a  # a view, as autograd hands it over
        b = b.transpose(-1, -2) if "b" in g["trans"] else b
        torch.matmul(a, b)
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            torch.matmul(a, b)
            ts.append(time.perf_counter() - t)
        times.append(statistics.median(ts))
    return times


def worker(framework: str, case: str, repeats: int) -> None:
    matmuls = step_matmuls(**CASES[case])
    times = (time_jax if framework == "jax" else time_torch)(matmuls, repeats)
    print(json.dumps(times))


def run_worker(python: str, framework: str, case: str, repeats: int) -> list[float]:
    cmd = [python, __file__, "--worker", framework, "--cases", case, "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{framework} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--torch", help="python of a venv with torch (see README)")
    p.add_argument("--cases", default="d256,d512")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument(
        "--name", default="", help="keeps this run in results-gemm-<name>-<machine kind>"
    )
    p.add_argument(
        "--steps", type=int, default=30, help="also time both whole trainers (0: matmuls only)"
    )
    p.add_argument("--worker", choices=["jax", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.cases, args.repeats)
        return
    if not args.torch:
        p.error("--torch PYTHON is required: the python of a venv with torch (see README)")

    sys.path.insert(0, str(HERE.parent))
    from conditions import conditions_markdown, machine_kind, measure_conditions

    pythons = {"jax": sys.executable, "torch": args.torch}
    results, steps, commands = {}, {}, {}
    with measure_conditions(packages=["jax", "jaxlib", "jaxstack-trainer"]) as conditions:
        for case in args.cases.split(","):
            per_round = {"jax": [], "torch": []}
            step_s = {"jax": [], "torch": []}
            for rnd in range(args.rounds):
                order = ["jax", "torch"] if rnd % 2 == 0 else ["torch", "jax"]
                for fw in order:
                    per_round[fw].append(run_worker(pythons[fw], fw, case, args.repeats))
                    print(case, rnd + 1, fw, "done", flush=True)
                for fw in order if args.steps else ():
                    out, cmd = train_whole_step(fw, case, args.steps, args.torch)
                    step_s[fw].append(BATCH * SEQ / out["tokens_per_sec"])
                    commands[f"{case} {fw}"] = " ".join(cmd)
                    print(case, rnd + 1, fw, f"step {step_s[fw][-1]:.3f} s", flush=True)
            results[case] = {
                fw: [statistics.median(col) for col in zip(*rs, strict=True)]
                for fw, rs in per_round.items()
            }
            if args.steps:
                steps[case] = step_s
    torch_version = subprocess.run(
        [args.torch, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    meta = conditions.as_dict()
    meta["versions"]["torch"] = torch_version
    meta["settings"] = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "dtype": "float32",
        "torch_threads": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "train_steps": args.steps,
        "host_allocator": "retain (jaxstack) / the same glibc tunables (torch)",
        "commands": commands,
    }
    kind = machine_kind(meta["cpu_model"], meta["cpu_flags"])
    name = f"{args.name}-{kind}" if args.name else kind
    write(results, steps, meta, name, conditions_markdown(meta))


def train_whole_step(framework: str, case: str, steps: int, torch_python: str):
    """(run.py's result, command) of one trainer for `steps` steps, both with retained host
    memory; jaxstack on `train.matmul_backend=default`, so XLA_FLAGS picks its kernels."""
    from run import RETAINED_MALLOC, run_jax, run_torch

    if framework == "jax":
        extra = ["train.matmul_backend=default"]
        return run_jax(CASES[case], steps, "float32", "retain", extra)
    return run_torch(torch_python, "minimal", CASES[case], steps, RETAINED_MALLOC)


def step_split(matmul_s: dict, step_s: dict) -> dict:
    """Each trainer's median step against its matmuls' sum; the rest is everything else the
    step does (norms, activations, softmax, loss, optimizer, copies, idle cores)."""
    step = {fw: statistics.median(ts) for fw, ts in step_s.items()}
    return {
        "step_s": step,
        "step_s_per_round": step_s,
        "matmul_s": matmul_s,
        "rest_s": {fw: step[fw] - matmul_s[fw] for fw in step},
        # What jaxstack's rest could be for its step to run 1.15x PyTorch's with its matmuls.
        "rest_s_for_1_15x": step["torch"] / 1.15 - matmul_s["jax"],
    }


def step_split_lines(split: dict) -> list[str]:
    step, mm, rest = split["step_s"], split["matmul_s"], split["rest_s"]

    def ms(x: float) -> str:
        return f"{x * 1e3:,.0f}"

    return [
        "",
        "| whole train step (median of rounds) | jaxstack | torch minimal |",
        "|---|---:|---:|",
        f"| step ms | {ms(step['jax'])} | {ms(step['torch'])} |",
        f"| its matmuls, summed from the table | {ms(mm['jax'])} | {ms(mm['torch'])} |",
        f"| the rest ms (share of the step) | {ms(rest['jax'])} "
        f"({rest['jax'] / step['jax']:.0%}) | {ms(rest['torch'])} "
        f"({rest['torch'] / step['torch']:.0%}) |",
        "",
        f"jaxstack's step is {step['torch'] / step['jax']:.2f}x PyTorch's speed. For 1.15x, with "
        f"these matmuls, the rest of its step would have to take {ms(split['rest_s_for_1_15x'])} "
        f"ms instead of {ms(rest['jax'])}.",
    ]


def write(results: dict, steps: dict, meta: dict, kind: str, conditions_md: str) -> None:
    rows, lines = (
        [],
        [
            "# XLA:CPU versus PyTorch matmuls at the train step's shapes",
            "",
            "Written by `benchmarks/train/gemm.py` (see README).",
            "",
            conditions_md,
            "",
            f"Settings: `{json.dumps(meta['settings'])}`",
        ],
    )
    for case, times in results.items():
        lines += [
            "",
            f"## {case}",
            "",
            "| matmul | batch x m x k x n | per step | jax ms | torch ms | jax GFLOP/s "
            "| torch GFLOP/s | jax speed / torch |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        step = {"jax": 0.0, "torch": 0.0}
        matmuls = step_matmuls(**CASES[case])
        for g, tj, tt in zip(matmuls, times["jax"], times["torch"], strict=True):
            flops = 2 * g["b"] * g["m"] * g["k"] * g["n"]
            step["jax"] += g["count"] * tj
            step["torch"] += g["count"] * tt
            row = g | {"case": case, "jax_s": tj, "torch_s": tt, "jax_over_torch_speed": tt / tj}
            rows.append(row)
            lines.append(
                f"| {g['name']} | {g['b']}x{g['m']}x{g['k']}x{g['n']} | {g['count']} "
                f"| {tj * 1e3:.2f} | {tt * 1e3:.2f} | {flops / tj / 1e9:.1f} "
                f"| {flops / tt / 1e9:.1f} | {tt / tj:.2f}x |"
            )
        lines += [
            "",
            f"All matmuls of one step: jax {step['jax'] * 1e3:.0f} ms, "
            f"torch {step['torch'] * 1e3:.0f} ms: XLA's kernels are "
            f"{step['torch'] / step['jax']:.2f}x PyTorch's speed on this step's products.",
        ]
        rows.append(
            {"case": case, "name": "step total", "jax_s": step["jax"], "torch_s": step["torch"]}
        )
        if case in steps:
            split = step_split(step, steps[case])
            rows.append({"case": case, "name": "whole step"} | split)
            lines += step_split_lines(split)
    out = HERE / f"results-gemm-{kind}"
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
