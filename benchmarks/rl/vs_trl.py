"""jaxstack-rl and TRL side by side: DPO/SFT/GRPO steps per second, same model and data.

    python benchmarks/rl/vs_trl.py --peers-python /tmp/peers/bin/python [--steps 40]

Both sides start from one HF folder (the `tiny-sft` preset's model after a short SFT, a
byte-level Llama of d_model 64 x 2 layers; `--model d256` a larger one) and train on the
`tiny-dpo` / `tiny-sft` presets' bundled records with aligned settings: fp32, batch 16,
constant learning rate 1e-3, no gradient clipping, no warmup, no packing, DPO's reference
log-probs computed live in each step (TRL's default), beta 0.1; GRPO 16 prompts x 8
completions of <= 4 tokens (case `grpo`) or <= 32 (`grpo-32`; both stop at eos), KL 0.04,
tiny-grpo's two rewards (samples/s = completions per iteration / iteration time). TRL runs in
a peers Python (torch CPU, transformers, TRL; benchmarks/rl/README.md says how to make one),
jaxstack here. Reported: the median step time over the steps after the first `--warmup`
(compiles) and the ratio; results-vs-trl.json keeps the settings, both sides' losses, GRPO's
mean completion length on each side and the run conditions.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import measure_conditions

HERE = pathlib.Path(__file__).parent
PACKAGES = ["jax", "jaxlib", "flax", "jaxstack-rl"]
SETTINGS = {"batch_size": 16, "learning_rate": 1e-3, "beta": 0.1}
GRPO_PROMPT_TOKENS = 12  # the longest tiny-prompts prompt, byte tokens
# case -> (algorithm, GRPO's max_new_tokens): GRPO with completions of at most 4 tokens is bound
# by per-step overhead on both sides; up to 32 tokens, by generation (completions stop at eos)
CASES = {"dpo": ("dpo", 0), "sft": ("sft", 0), "grpo": ("grpo", 4), "grpo-32": ("grpo", 32)}
MAX_LENGTH = {"dpo": 48, "sft": 64} | {
    case: GRPO_PROMPT_TOKENS + tokens for case, (a, tokens) in CASES.items() if a == "grpo"
}
MODELS = {  # model.* overrides of the tiny-sft preset that makes the starting HF folder
    "tiny": [],
    "d256": ["model.d_model=256", "model.num_layers=4", "model.head_dim=64", "model.mlp_dim=768"],
}
GRPO = {"batch_size": 16, "group_size": 8, "kl_coef": 0.04}


def jaxstack_side(case: str, model: pathlib.Path, steps: int, run_dir: pathlib.Path):
    from jaxstack import rl
    from jaxstack.trainer import read_jsonl

    algorithm, max_new_tokens = CASES[case]
    overrides = [
        f"init.hf={model}",
        f"train.steps={steps}",
        f"log.run_dir={run_dir}",
        f"data.batch_size={SETTINGS['batch_size']}",
        f"data.seq_len={MAX_LENGTH[case]}",
        f"optim.lr={SETTINGS['learning_rate']}",
        "optim.schedule.name=constant",
        "optim.schedule.warmup_steps=0",
        "checkpoint.enabled=false",
        "log.tensorboard=false",
    ]
    if algorithm == "dpo":
        overrides += ["dpo.reference=live", f"dpo.beta={SETTINGS['beta']}"]
    elif algorithm == "sft":
        overrides += ["data.packing=pad"]
    else:  # prompts x completions per iteration, as TRL's batch of completions
        overrides += [
            f"data.batch_size={GRPO['batch_size']}",
            f"rollout.group_size={GRPO['group_size']}",
            f"rollout.max_new_tokens={max_new_tokens}",
            f"grpo.kl_coef={GRPO['kl_coef']}",
        ]
    config = rl.load_config(algorithm, f"tiny-{algorithm}", overrides)
    getattr(rl, algorithm)(config)
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    lengths = [r["completions/mean_length"] for r in records if "completions/mean_length" in r]
    return [r["step_time_s"] for r in records], [r["loss"] for r in records], lengths, config


def trl_side(python: str, case: str, model: pathlib.Path, data: str, steps: int, out):
    algorithm, max_new_tokens = CASES[case]
    spec = {
        "algorithm": algorithm,
        "model": str(model),
        "data": data,
        "steps": steps,
        "max_length": MAX_LENGTH[case],
        "out": str(out),
        **SETTINGS,
        **(dict(GRPO, max_new_tokens=max_new_tokens) if algorithm == "grpo" else {}),
    }
    (out.parent / f"{case}-spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [python, str(HERE / "trl_side.py"), str(out.parent / f"{case}-spec.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"TRL side failed:\n{proc.stderr[-4000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    return (
        result["step_times_s"],
        result["losses"],
        result["completion_lengths"],
        result["versions"],
    )


def mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peers-python", required=True, help="a Python with torch, transformers, TRL")
    p.add_argument("--steps", type=int, default=40, help="optimiser steps per side (>= 10)")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out (>= 1)")
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="tiny",
        help="the model both sides train: tiny-sft's own (d_model 64 x 2 layers) or a larger one",
    )
    p.add_argument(
        "--algorithms",
        nargs="+",
        choices=list(CASES),
        default=list(CASES),
        help="grpo: completions of at most 4 tokens; grpo-32: at most 32",
    )
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=HERE,
        help="folder for results-vs-trl.json (default: here, merged with the algorithms not rerun)",
    )
    args = p.parse_args()
    if args.steps < 10 or not 1 <= args.warmup < args.steps:
        p.error("--steps must be >= 10 and --warmup in [1, steps)")
    from jaxstack import rl

    settings = {**SETTINGS, "max_length": MAX_LENGTH, "steps": args.steps, "warmup": args.warmup}
    results = {"settings": {**settings, "model": args.model, "model_overrides": MODELS[args.model]}}
    with tempfile.TemporaryDirectory() as tmp, measure_conditions(PACKAGES) as conditions:
        tmp = pathlib.Path(tmp)
        start = rl.load_config(
            "sft",
            "tiny-sft",
            [
                f"log.run_dir={tmp / 'start'}",
                "train.steps=50",
                "log.tensorboard=false",
                *MODELS[args.model],
            ],
        )
        rl.sft(start)
        model = tmp / "start" / "model"
        for algorithm in args.algorithms:
            ours, our_losses, our_lengths, config = jaxstack_side(
                algorithm, model, args.steps, tmp / algorithm
            )
            theirs, their_losses, their_lengths, versions = trl_side(
                args.peers_python,
                algorithm,
                model,
                config.base.data.path,
                args.steps,
                tmp / f"trl-{algorithm}",
            )
            ours_s = statistics.median(ours[args.warmup :])
            theirs_s = statistics.median(theirs[args.warmup :])
            results[algorithm] = {
                "jaxstack_median_step_s": ours_s,
                "trl_median_step_s": theirs_s,
                "jaxstack_steps_per_sec": 1 / ours_s,
                "trl_steps_per_sec": 1 / theirs_s,
                "ratio": theirs_s / ours_s,
                **(
                    {
                        "jaxstack_samples_per_sec": GRPO["batch_size"]
                        * GRPO["group_size"]
                        / ours_s,
                        "trl_samples_per_sec": GRPO["batch_size"] * GRPO["group_size"] / theirs_s,
                    }
                    if CASES[algorithm][0] == "grpo"
                    else {}
                ),
                "jaxstack_loss_first_last": [our_losses[0], our_losses[-1]],
                "trl_loss_first_last": [their_losses[0], their_losses[-1]],
                "max_new_tokens": CASES[algorithm][1] or None,
                # GRPO: mean completion length over the timed iterations, each side
                "jaxstack_mean_completion_tokens": mean_or_none(our_lengths[args.warmup :]),
                "trl_mean_completion_tokens": mean_or_none(their_lengths[args.warmup :]),
            }
            results["trl_versions"] = versions
            print(
                f"{algorithm}: jaxstack {1 / ours_s:.1f} steps/s, TRL {1 / theirs_s:.1f} "
                f"steps/s, ratio {theirs_s / ours_s:.2f}"
            )
    results["conditions"] = conditions.as_dict()
    for algorithm in args.algorithms:  # each algorithm keeps the conditions of its own run
        results[algorithm].update(conditions=results["conditions"], steps=args.steps)
    del results["conditions"]
    args.out.mkdir(parents=True, exist_ok=True)
    name = "results-vs-trl.json" if args.model == "tiny" else f"results-vs-trl-{args.model}.json"
    path = args.out / name
    previous = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**previous, **results}, indent=2))


if __name__ == "__main__":
    main()
