"""benchmarks/train/profile_step.py: where a training step's time goes, jaxstack against PyTorch.

    .venv/bin/python benchmarks/train/profile_step.py --torch /tmp/torchvenv/bin/python \
        --cases d256,d512

For each case (run.py's model and batch, fp32), one jaxstack-train run traces three steps with
xprof-lite (`log.profile_start`) and one run of the minimal PyTorch trainer profiles three steps
with torch.profiler (`torch_llama.py --profile-steps`), each after its warm-up. Each op's self
time per step is put in a category: matrix products; attention (PyTorch's fused
scaled-dot-product kernels, whose products XLA counts as matmul); copies and transposes; the
rest (elementwise, reductions, optimiser). Op times are summed over the threads that ran them
(XLA:CPU runs independent ops of a step concurrently, so its sum can exceed the step's wall
time; PyTorch runs ops one after another, parallel inside each), and the table also gives each
step's wall time. Both trainers run with glibc's default malloc, so the allocator setting is the
same for both. Writes results-profile-<machine kind>.md/.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import measure_conditions
from run import CASES, jax_cmd, torch_cmd, write_results

PROFILED_STEPS = 3
ROWS = ("matmul", "attention", "copy", "rest")
TORCH_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"}
TORCH_COPY = {"aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous"}


def torch_category(op: str) -> str:
    if op in TORCH_MATMUL:
        return "matmul"
    if op.startswith("aten::_scaled_dot_product"):
        return "attention"
    return "copy" if op in TORCH_COPY else "rest"


def profile_jax(case: dict, steps: int) -> tuple[dict, str]:
    """ms per step by category from xprof-lite's op profile of the traced steps, and the wall."""
    from jaxstack import xprof_lite

    with tempfile.TemporaryDirectory() as d:
        extra = [
            f"log.profile_start={steps - PROFILED_STEPS}",
            f"log.profile_steps={PROFILED_STEPS}",
        ]
        cmd = jax_cmd(case, steps, d + "/run", "float32", "system", extra)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        data = xprof_lite.load_trace(pathlib.Path(d, "run", "profile"))
        (profile,) = [p for p in xprof_lite.profile_from_trace(data) if p.module == "jit_step"]
        wall_ms = [s.total_ms for s in xprof_lite.step_breakdown(data) if s.name == "train"]
    ms = {c: v["time_ns"] / 1e6 for c, v in profile.by_category().items()}  # per execution
    out = {
        "matmul": ms.pop("matmul"),
        "attention": ms.pop("attention"),
        "copy": ms.pop("copy"),
        "rest": sum(ms.values()),
    }
    out["wall"] = sum(wall_ms) / len(wall_ms)
    return out, " ".join(cmd)


def profile_torch(python: str, case: dict, steps: int) -> tuple[dict, str]:
    """ms per step by category from torch.profiler's self CPU times, and the wall."""
    cmd = [*torch_cmd(python, "minimal", case, steps), "--profile-steps", str(PROFILED_STEPS)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    out = dict.fromkeys(ROWS, 0.0)
    for op, ms in result["ops_ms_per_step"].items():
        out[torch_category(op)] += ms
    out["wall"] = result["profiled_step_s"] * 1e3
    return out, " ".join(cmd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--torch", required=True, help="python of a venv with torch")
    p.add_argument("--cases", default="d256,d512")
    p.add_argument("--steps", type=int, default=8, help="steps per run, the last 3 profiled")
    args = p.parse_args()
    results, commands = {}, {}
    packages = ["jax", "jaxlib", "jaxstack-trainer", "jaxstack-xprof-lite"]
    with measure_conditions(packages=packages) as conditions:
        for name in args.cases.split(","):
            jax_ms, commands[f"{name} jaxstack"] = profile_jax(CASES[name], args.steps)
            torch_ms, commands[f"{name} torch"] = profile_torch(args.torch, CASES[name], args.steps)
            results[name] = {"jaxstack": jax_ms, "torch minimal": torch_ms}
            print(name, json.dumps(results[name]), flush=True)
    meta = conditions.as_dict() | {"steps": args.steps, "profiled_steps": PROFILED_STEPS}
    lines = [
        f"fp32, batch 8 x seq 256, 4 layers, head_dim 64, vocab 4096, AdamW, glibc's default "
        f"malloc for both; the last {PROFILED_STEPS} of {args.steps} steps profiled. "
        "Milliseconds per step (share of the op time summed over categories).",
        "",
    ]
    for name, by in results.items():
        j, t = by["jaxstack"], by["torch minimal"]
        jt, tt = sum(j[r] for r in ROWS), sum(t[r] for r in ROWS)
        lines += [
            f"## {name}",
            "",
            "| category | jaxstack ms | torch minimal ms | jaxstack / torch |",
            "|---|---:|---:|---:|",
        ]
        for row in ROWS:
            ratio = f"{j[row] / t[row]:.2f}" if t[row] > 0.5 else "-"
            lines.append(
                f"| {row} | {j[row]:,.0f} ({j[row] / jt:.0%}) | {t[row]:,.0f} ({t[row] / tt:.0%}) "
                f"| {ratio} |"
            )
        lines += [
            f"| all ops | {jt:,.0f} | {tt:,.0f} | {jt / tt:.2f} |",
            f"| step wall time | {j['wall']:,.0f} | {t['wall']:,.0f} "
            f"| {j['wall'] / t['wall']:.2f} |",
            "",
        ]
    lines += ["Commands:", ""] + [f"- {k}: `{v}`" for k, v in commands.items()]
    payload = {"ms_per_step": results, "commands": commands}
    print(write_results("profile", meta, payload, "Where a train step's time goes", lines))


if __name__ == "__main__":
    main()
