"""benchmarks/train: jaxstack-train versus PyTorch trainers on this machine, same run.

    .venv/bin/python benchmarks/train/run.py [--steps 60] [--rounds 1] \
        [--torch /tmp/torchvenv/bin/python]

Cases (fp32, AdamW, batch 8 x seq 256, vocab 4096, 4 layers, head_dim 64):
d256 (4 heads, SwiGLU 1024) and d512 (8 heads, SwiGLU 2048), plus jaxstack with bf16 compute.
Peers: a minimal PyTorch Llama (torch_llama.py --impl minimal) and HF LlamaForCausalLM
(--impl hf), run from a separate torch venv. Runs are interleaved round by round so machine load
hits every trainer alike; each trainer reports the median step time after warm-up. MFU uses
nnlib's model FLOPs per token over the measured XLA matmul peak of this CPU (xprof-lite's best
of repeats). The run conditions (CPU model and vector flags, load before/during/after,
versions) come from ../conditions.py. Writes results-<machine kind>.md and .json next to this
file (e.g. results-amd-epyc-avx2.md), so each CPU kind keeps its own results side by side.
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

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import conditions_markdown, machine_kind, measure_conditions

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


def jax_cmd(
    case: dict, steps: int, run_dir: str, dtype: str, allocator: str, extra: list[str]
) -> list[str]:
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
        *extra,
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
    """MaxText's own trainer at its best fp32 CPU settings (the flags below; see the README)."""
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


def run_jax(
    case: dict, steps: int, dtype: str, allocator: str, extra: list[str] = ()
) -> tuple[dict, list[str]]:
    with tempfile.TemporaryDirectory() as d:
        cmd = jax_cmd(case, steps, d + "/run", dtype, allocator, list(extra))
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        lines = pathlib.Path(d, "run", "metrics.jsonl").read_text().splitlines()
        recs = [json.loads(x) for x in lines]
    s = [r for r in recs if r["kind"] == "summary"][-1]
    out = {
        "tokens_per_sec": s["median_tokens_per_sec"],
        "final_loss": s["final_loss"],
        # What the run used; with `auto` in a run of 40+ steps, what its trial chose and why.
        "host_allocator": s["host_allocator"],
        "host_allocator_trial_step_s": s.get("host_allocator_trial_step_s"),
        "matmul_backend": s["matmul_backend"],
        "matmul_backend_trial_step_s": s.get("matmul_backend_trial_step_s"),
    }
    return out, cmd


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--torch", default="/tmp/torchvenv/bin/python")
    p.add_argument("--cases", default="d256,d512")
    p.add_argument("--hf-cases", default="d256,d512", help="cases that also run HF Llama")
    p.add_argument("--maxtext", help="python of a venv with maxtext (see README); off if unset")
    p.add_argument(
        "--backend-cases",
        default="d256,d512",
        help="cases that also run jaxstack with each train.matmul_backend fixed",
    )
    p.add_argument("--name", help="results-NAME-<machine kind>.md/.json instead of results-<kind>")
    p.add_argument("--out", type=pathlib.Path, help="write results.md/.json into this folder")
    p.add_argument(
        "--allocator-cases",
        default="d256",
        help="cases that also run every trainer with the other host-allocator setting",
    )
    args = p.parse_args()

    from jaxstack import xprof_lite

    rows, commands = [], {}
    packages = ["jax", "jaxlib", "jaxstack-trainer", "jaxstack-nnlib", "jaxstack-xprof-lite"]
    with measure_conditions(packages=packages) as conditions:
        peaks = {dt: xprof_lite.measure_matmul_flops(dt) for dt in ("float32", "bfloat16")}
        guess = xprof_lite.choose_host_allocator()
        for case_name in args.cases.split(","):
            rows += run_case(args, case_name, peaks, commands)
    meta = conditions.as_dict() | {
        "matmul_peak_gflops": {k: v / 1e9 for k, v in peaks.items()},
        "host_allocator_flags_guess": guess,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    lines = [
        f"{args.steps} steps per trainer (median step time after warm-up), {args.rounds} "
        f"round(s), interleaved. XLA matmul peak measured in this run (best of repeats): fp32 "
        f"{meta['matmul_peak_gflops']['float32']:.0f} GFLOP/s, bf16 "
        f"{meta['matmul_peak_gflops']['bfloat16']:.0f} GFLOP/s. With `host_allocator=auto` a "
        "jaxstack run of 40+ steps times its first 12 steps under `system` and `retain` and keeps "
        "the faster (its choice per round is in the settings; tokens/s counts the steps after "
        f"the trial); shorter runs take the CPU flags' guess, `{guess}` here. With "
        "`matmul_backend=auto` it then times 12 steps under XLA's default matmul kernels and "
        "under oneDNN's and keeps the faster. Every trainer: "
        "batch 8 x seq 256, 4 layers, head_dim 64, vocab "
        "4096, AdamW; the settings column lists everything else that differs between rows.",
        "",
        "| case | trainer | settings | tokens/s | vs torch minimal | vs MaxText | MFU vs matmul "
        "peak | final loss |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        vs_maxtext = f"{r['vs_maxtext']:.2f}x" if r["vs_maxtext"] else "-"
        lines.append(
            f"| {r['case']} | {r['trainer']} | {r['settings']} | {r['tokens_per_sec']:,.0f} | "
            f"{r['vs_torch_minimal']:.2f}x | {vs_maxtext} | {r['mfu_vs_matmul_peak']:.0%} | "
            f"{r['final_loss']:.3f} |"
        )
    lines += ["", "Commands:", ""] + [f"- {k}: `{v}`" for k, v in commands.items()]
    payload = {"rows": rows, "commands": commands}
    print(write_results(args.name, meta, payload, "benchmarks/train results", lines, args.out))


def write_results(
    name: str | None,
    meta: dict,
    payload: dict,
    title: str,
    body: list,
    out: pathlib.Path | None = None,
) -> str:
    """Writes results-[name-]<machine kind>.json and .md (title, run conditions, body) here, or
    results.json and .md into `out`."""
    kind = machine_kind(meta["cpu_model"], meta["cpu_flags"])
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        stem = out / "results"
    else:
        stem = HERE / ("results-" + (f"{name}-" if name else "") + kind)
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, **payload}, indent=1))
    text = "\n".join([f"# {title} on {kind}", "", conditions_markdown(meta), "", *body]) + "\n"
    stem.with_suffix(".md").write_text(text)
    return text


def run_case(args, case_name: str, peaks: dict, commands: dict) -> list[dict]:
    """Every trainer of one case, interleaved round by round; one row per trainer."""
    case = CASES[case_name]
    flops = model_flops(case)
    retained_env = " ".join(f"{k}={v}" for k, v in RETAINED_MALLOC.items())
    # name -> (settings, runner)
    trainers = {
        "jaxstack fp32": (
            "float32, host_allocator=auto, matmul_backend=auto",
            lambda: run_jax(case, args.steps, "float32", "auto"),
        ),
        "jaxstack bf16": (
            "bfloat16 compute, f32 master weights, host_allocator=auto, matmul_backend=auto",
            lambda: run_jax(case, args.steps, "bfloat16", "auto"),
        ),
        "torch minimal fp32": (
            "float32, system malloc, 2 threads",
            lambda: run_torch(args.torch, "minimal", case, args.steps),
        ),
    }
    if case_name in args.backend_cases.split(","):
        for backend in ("default", "onednn"):
            trainers[f"jaxstack fp32, matmul_backend={backend}"] = (
                f"float32, host_allocator=auto, matmul_backend={backend}",
                lambda backend=backend: run_jax(
                    case, args.steps, "float32", "auto", [f"train.matmul_backend={backend}"]
                ),
            )
    if case_name in args.allocator_cases.split(","):
        for mode in ("system", "retain"):
            trainers[f"jaxstack fp32, host_allocator={mode}"] = (
                f"float32, host_allocator={mode}",
                lambda mode=mode: run_jax(case, args.steps, "float32", mode),
            )
        trainers["torch minimal fp32, retained malloc"] = (
            f"float32, {retained_env}, 2 threads",
            lambda: run_torch(args.torch, "minimal", case, args.steps, RETAINED_MALLOC),
        )
    if case_name in args.hf_cases.split(","):
        trainers["HF Llama fp32"] = (
            "float32, SDPA, system malloc, 2 threads",
            lambda: run_torch(args.torch, "hf", case, args.steps),
        )
    if args.maxtext:
        trainers["MaxText fp32"] = (
            "float32, scan_layers=false, remat_policy=minimal, synthetic data",
            lambda: run_maxtext(args.maxtext, case, args.steps, {}),
        )
    results: dict[str, list[dict]] = {k: [] for k in trainers}
    for _ in range(args.rounds):
        for name, (_, fn) in trainers.items():
            out, cmd = fn()
            results[name].append(out)
            commands[f"{case_name} {name}"] = shlex.join(cmd)
            print(case_name, name, out, flush=True)
    ref = statistics.median(r["tokens_per_sec"] for r in results["torch minimal fp32"])
    maxtext = results.get("MaxText fp32")
    ref_maxtext = statistics.median(r["tokens_per_sec"] for r in maxtext) if maxtext else None
    rows = []
    for name, outs in results.items():
        tps = statistics.median(r["tokens_per_sec"] for r in outs)
        peak = peaks["bfloat16" if "bf16" in name else "float32"]
        settings = trainers[name][0]
        if "host_allocator=auto" in settings:
            chose = [r["host_allocator"] for r in outs]
            if settings.endswith("matmul_backend=auto"):
                chose = [f"{a} + {r['matmul_backend']}" for a, r in zip(chose, outs, strict=True)]
            settings += f" (chose {' / '.join(chose)})"
        rows.append(
            {
                "case": case_name,
                "trainer": name,
                "settings": settings,
                "tokens_per_sec": tps,
                "tokens_per_sec_each_round": [r["tokens_per_sec"] for r in outs],
                "vs_torch_minimal": tps / ref,
                "vs_maxtext": tps / ref_maxtext if ref_maxtext else None,
                "mfu_vs_matmul_peak": tps * flops / peak,
                "final_loss": outs[-1]["final_loss"],
                "runs": len(outs),
            }
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
