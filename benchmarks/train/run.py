"""benchmarks/train: jaxstack-train versus PyTorch trainers on this machine, same run.

    .venv/bin/python benchmarks/train/run.py [--steps 30] [--rounds 1] \
        [--torch /tmp/torchvenv/bin/python]

Cases (fp32, AdamW, batch 8 x seq 256, vocab 4096, 4 layers, head_dim 64):
d256 (4 heads, SwiGLU 1024) and d512 (8 heads, SwiGLU 2048), plus jaxstack with bf16 compute.
Peers: a minimal PyTorch Llama (torch_llama.py --impl minimal) and HF LlamaForCausalLM
(--impl hf), run from a separate torch venv. Runs are interleaved round by round so machine load
hits every trainer alike; each trainer reports the median step time after warm-up. MFU uses
nnlib's model FLOPs per token over the measured XLA matmul peak of this CPU. Writes results.md
and results.json next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[1]
CASES = {
    "d256": dict(d_model=256, heads=4, mlp=1024),
    "d512": dict(d_model=512, heads=8, mlp=2048),
}


# glibc settings equal to jaxstack-train's `train.host_allocator=retain`, for the peers' processes.
RETAINED_MALLOC = {
    "GLIBC_TUNABLES": "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0"
    ":glibc.malloc.trim_threshold=2147483647"
}


def jax_cmd(case: dict, steps: int, run_dir: str, dtype: str, allocator: str) -> list[str]:
    return [
        str(ROOT / ".venv/bin/jaxstack-train"),
        "--config",
        "tiny",
        f"--run-dir={run_dir}",
        f"model.d_model={case['d_model']}",
        f"model.num_heads={case['heads']}",
        f"model.num_kv_heads={case['heads']}",
        "model.head_dim=64",
        f"model.mlp_dim={case['mlp']}",
        "model.num_layers=4",
        "model.vocab_size=4096",
        f"model.dtype={dtype}",
        "data.seq_len=256",
        "data.batch_size=8",
        f"train.steps={steps}",
        "optim.schedule.warmup_steps=2",
        "eval.every=0",
        "eval.batches=1",
        "checkpoint.enabled=false",
        "log.sample_tokens=0",
        "log.report=false",
        "log.tensorboard=false",
        "log.progress=plain",
        f"train.host_allocator={allocator}",
    ]


def torch_cmd(python: str, impl: str, case: dict, steps: int) -> list[str]:
    return [
        python,
        str(HERE / "torch_llama.py"),
        "--impl",
        impl,
        "--d-model",
        str(case["d_model"]),
        "--heads",
        str(case["heads"]),
        "--mlp",
        str(case["mlp"]),
        "--layers",
        "4",
        "--head-dim",
        "64",
        "--vocab",
        "4096",
        "--seq",
        "256",
        "--batch",
        "8",
        "--steps",
        str(steps),
        "--warmup",
        "3",
    ]


MAXTEXT_STEP = re.compile(r"completed step: (\d+), seconds: ([\d.]+),.*? loss: ([\d.]+)")


def maxtext_cmd(python: str, case: dict, steps: int, out_dir: str) -> list[str]:
    """MaxText's own trainer at its best fp32 CPU settings (see ../../shared/LIBRARY-NOTES.md)."""
    configs = subprocess.run(
        [python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return [
        python,
        "-m",
        "maxtext.trainers.pre_train.train",
        f"{configs}/configs/base.yml",
        "run_name=bench",
        f"base_output_directory={out_dir}",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
        "dataset_type=synthetic",
        f"steps={steps}",
        "per_device_batch_size=8",
        "max_target_length=256",
        f"base_emb_dim={case['d_model']}",
        f"base_num_query_heads={case['heads']}",
        f"base_num_kv_heads={case['heads']}",
        f"base_mlp_dim={case['mlp']}",
        "base_num_decoder_layers=4",
        "head_dim=64",
        "vocab_size=4096",
        "dtype=float32",
        "weight_dtype=float32",
        "scan_layers=false",
        "remat_policy=minimal",
        "enable_checkpointing=false",
        "enable_goodput_recording=false",
        "monitor_goodput=false",
        "enable_tensorboard=false",
        "profiler=''",
        "jax_cache_dir=''",
    ]


def run_maxtext(python: str, case: dict, steps: int, env: dict) -> tuple[dict, list[str]]:
    """Median step time of MaxText's `completed step` log lines after 3 warm-up steps."""
    with tempfile.TemporaryDirectory() as d:
        cmd = maxtext_cmd(python, case, steps, d)
        env = {"DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu", **env}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=d, env=os.environ | env)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    log = proc.stdout + proc.stderr
    steps_s = [(int(a), float(b), float(c)) for a, b, c in MAXTEXT_STEP.findall(log)]
    times = [t for step, t, _ in steps_s if step >= 3]
    result = {"tokens_per_sec": 8 * 256 / statistics.median(times), "final_loss": steps_s[-1][2]}
    return result, with_env(env, cmd)


def run_jax(case: dict, steps: int, dtype: str, allocator: str) -> tuple[dict, list[str]]:
    with tempfile.TemporaryDirectory() as d:
        cmd = jax_cmd(case, steps, d + "/run", dtype, allocator)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        lines = pathlib.Path(d, "run", "metrics.jsonl").read_text().splitlines()
        recs = [json.loads(x) for x in lines]
    s = [r for r in recs if r["kind"] == "summary"][-1]
    return {"tokens_per_sec": s["median_tokens_per_sec"], "final_loss": s["final_loss"]}, cmd


def run_torch(
    python: str, impl: str, case: dict, steps: int, env: dict | None = None
) -> tuple[dict, list[str]]:
    cmd = torch_cmd(python, impl, case, steps)
    env = env or {}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | env)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"tokens_per_sec": out["tokens_per_sec"], "final_loss": out["final_loss"]}, with_env(
        env, cmd
    )


def with_env(env: dict, cmd: list[str]) -> list[str]:
    """The command as a shell would run it, with its environment settings in front."""
    return [f"{k}={v}" for k, v in env.items()] + cmd


def model_flops(case: dict) -> float:
    from jaxstack import nnlib

    cfg = nnlib.get_preset("tiny").replace(
        d_model=case["d_model"],
        num_heads=case["heads"],
        num_kv_heads=case["heads"],
        head_dim=64,
        mlp_dim=case["mlp"],
        num_layers=4,
        vocab_size=4096,
    )
    return nnlib.training_flops_per_token(cfg, 256)


def _load_sentence(before: float, after: float, cores: int) -> str:
    """Say whether other work competed with the run, from the load average around it."""
    loads = f"load average {before:.1f} before, {after:.1f} after, on {cores} cores"
    if before > 1.5:
        return (
            f"**Other work was running on the machine** ({loads}): absolute numbers are below an "
            "idle machine's; the ratios within one case are the meaningful part."
        )
    return f"No other work was running ({loads}; the benchmark itself accounts for the load)."


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--torch", default="/tmp/torchvenv/bin/python")
    p.add_argument("--cases", default="d256,d512")
    p.add_argument("--hf-cases", default="d256,d512", help="cases that also run HF Llama")
    p.add_argument("--maxtext", help="python of a venv with maxtext (see README); off if unset")
    p.add_argument(
        "--allocator-cases",
        default="d256",
        help="cases that also run every trainer with the other host-allocator setting",
    )
    args = p.parse_args()

    from jaxstack.trainer import measure_matmul_peak

    peaks = {dt: max(measure_matmul_peak(dt) for _ in range(3)) for dt in ("float32", "bfloat16")}
    load_before = os.getloadavg()
    rows, commands = [], {}
    t0 = time.time()
    for case_name in args.cases.split(","):
        case = CASES[case_name]
        flops = model_flops(case)
        swap_allocator = case_name in args.allocator_cases.split(",")
        trainers = {
            "jaxstack fp32": lambda c=case: run_jax(c, args.steps, "float32", "retain"),
            "jaxstack bf16": lambda c=case: run_jax(c, args.steps, "bfloat16", "retain"),
            "torch minimal fp32": lambda c=case: run_torch(args.torch, "minimal", c, args.steps),
        }
        if swap_allocator:
            trainers["jaxstack fp32, system malloc"] = lambda c=case: run_jax(
                c, args.steps, "float32", "system"
            )
            trainers["torch minimal fp32, retained malloc"] = lambda c=case: run_torch(
                args.torch, "minimal", c, args.steps, RETAINED_MALLOC
            )
        if case_name in args.hf_cases.split(","):
            trainers["HF Llama fp32"] = lambda c=case: run_torch(args.torch, "hf", c, args.steps)
        if args.maxtext:
            trainers["MaxText fp32"] = lambda c=case: run_maxtext(args.maxtext, c, args.steps, {})
            if swap_allocator:
                trainers["MaxText fp32, retained malloc"] = lambda c=case: run_maxtext(
                    args.maxtext, c, args.steps, RETAINED_MALLOC
                )
        results: dict[str, list[dict]] = {k: [] for k in trainers}
        for _ in range(args.rounds):
            for name, fn in trainers.items():
                out, cmd = fn()
                results[name].append(out)
                commands[f"{case_name} {name}"] = shlex.join(cmd)
                print(case_name, name, out, flush=True)
        ref = statistics.median(r["tokens_per_sec"] for r in results["torch minimal fp32"])
        maxtext = results.get("MaxText fp32")
        ref_maxtext = statistics.median(r["tokens_per_sec"] for r in maxtext) if maxtext else None
        for name, outs in results.items():
            tps = statistics.median(r["tokens_per_sec"] for r in outs)
            peak = peaks["bfloat16" if "bf16" in name else "float32"]
            rows.append(
                {
                    "case": case_name,
                    "trainer": name,
                    "tokens_per_sec": tps,
                    "vs_torch_minimal": tps / ref,
                    "vs_maxtext": tps / ref_maxtext if ref_maxtext else None,
                    "mfu_vs_matmul_peak": tps * flops / peak,
                    "final_loss": outs[-1]["final_loss"],
                    "runs": len(outs),
                }
            )
    load_after = os.getloadavg()
    meta = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "cpu_cores": len(os.sched_getaffinity(0)),
        "matmul_peak_gflops": {k: v / 1e9 for k, v in peaks.items()},
        "load_average_before": load_before,
        "load_average_after": load_after,
        "wall_s": time.time() - t0,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    (HERE / "results.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "commands": commands}, indent=1)
    )
    lines = [
        "# benchmarks/train results",
        "",
        f"Run {meta['date_utc']} UTC on {meta['cpu_cores']} CPU cores, {args.steps} steps per "
        f"trainer (median step time after warm-up), {args.rounds} round(s), interleaved.",
        _load_sentence(load_before[0], load_after[0], meta["cpu_cores"]),
        f"XLA matmul peak measured now: fp32 {meta['matmul_peak_gflops']['float32']:.0f} GFLOP/s,"
        f" bf16 {meta['matmul_peak_gflops']['bfloat16']:.0f} GFLOP/s.",
        "",
        "| case | trainer | tokens/s | vs torch minimal | vs MaxText | MFU vs matmul peak |"
        " final loss |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        vs_maxtext = f"{r['vs_maxtext']:.2f}x" if r["vs_maxtext"] else "-"
        lines.append(
            f"| {r['case']} | {r['trainer']} | {r['tokens_per_sec']:,.0f} | "
            f"{r['vs_torch_minimal']:.2f}x | {vs_maxtext} | {r['mfu_vs_matmul_peak']:.0%} | "
            f"{r['final_loss']:.3f} |"
        )
    lines += ["", "Commands:", ""] + [f"- {k}: `{v}`" for k, v in commands.items()]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
