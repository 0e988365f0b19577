"""benchmarks/train/ab.py: interleaved A/B(/C...) runs of jaxstack-train settings on this CPU.

    .venv/bin/python benchmarks/train/ab.py --name allocator --cases d256 --rounds 4 \
        --variant retain=train.host_allocator=retain --variant system=train.host_allocator=system

Each `--variant "LABEL=OVERRIDE[;OVERRIDE...]"` adds settings to the benchmark command of
run.py (fp32, batch 8 x 256, 4 layers). Every round runs every variant once, and the order
rotates by one each round (A B, then B A; A B C, B C A, C A B, ...), so load that drifts during
the run hits every variant alike. Each run reports the trainer's own median tokens/s after its
first two steps; each round gives every variant's ratio to the first variant, and the table
reports the median ratio over the rounds. The run conditions (CPU model and vector flags, load
before/during/after) come from ../conditions.py. Writes results-<name>-<machine kind>.md/.json.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import measure_conditions
from run import CASES, run_jax, write_results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True, help="what is compared, for the results file name")
    p.add_argument("--variant", action="append", required=True, help="LABEL=OVERRIDE[;...]")
    p.add_argument("--cases", default="d256")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    variants = {}
    for v in args.variant:
        label, _, overrides = v.partition("=")
        variants[label] = [o for o in overrides.split(";") if o]
    labels = list(variants)

    runs = []
    with measure_conditions(packages=["jax", "jaxlib", "jaxstack-trainer"]) as conditions:
        for case_name in args.cases.split(","):
            for rnd in range(args.rounds):
                order = labels[rnd % len(labels) :] + labels[: rnd % len(labels)]
                for label in order:
                    out, cmd = run_jax(
                        CASES[case_name], args.steps, "float32", "auto", variants[label]
                    )
                    runs.append(
                        {
                            "case": case_name,
                            "round": rnd + 1,
                            "variant": label,
                            "tokens_per_sec": out["tokens_per_sec"],
                            "host_allocator": out["host_allocator"],
                            "host_allocator_trial_step_s": out["host_allocator_trial_step_s"],
                            "matmul_backend": out["matmul_backend"],
                            "matmul_backend_trial_step_s": out["matmul_backend_trial_step_s"],
                            "command": " ".join(cmd),
                        }
                    )
                    print(
                        case_name,
                        rnd + 1,
                        label,
                        f"{out['tokens_per_sec']:,.0f}",
                        out["host_allocator"],
                        out["matmul_backend"],
                        flush=True,
                    )
    meta = conditions.as_dict() | {"steps": args.steps, "rounds": args.rounds}
    lines = [
        f"{args.steps} steps per run (median tokens/s after the first two), fp32, batch 8 x 256, "
        f"{args.rounds} rounds, the order rotating every round. Ratios are to "
        f"`{labels[0]}` within each round.",
        "",
        "| case | variant | settings | tokens/s per round | median ratio to "
        f"{labels[0]} | ratio per round | host allocator + matmul backend per round |",
        "|---|---|---|---|---:|---|---|",
    ]
    for case_name in args.cases.split(","):
        by = {(r["round"], r["variant"]): r for r in runs if r["case"] == case_name}
        rounds = range(1, args.rounds + 1)
        for label in labels:
            per_round = [by[(k, label)]["tokens_per_sec"] for k in rounds]
            ratios = [
                t / by[(k, labels[0])]["tokens_per_sec"]
                for k, t in zip(rounds, per_round, strict=True)
            ]
            allocators = " / ".join(
                f"{by[(k, label)]['host_allocator']} + {by[(k, label)]['matmul_backend']}"
                for k in rounds
            )
            lines.append(
                f"| {case_name} | {label} | `{' '.join(variants[label]) or '(none)'}` | "
                f"{' / '.join(f'{t:,.0f}' for t in per_round)} | "
                f"{statistics.median(ratios):.2f}x | {' / '.join(f'{x:.2f}' for x in ratios)} | "
                f"{allocators} |"
            )
    lines += [
        "",
        "With `auto`, a run of 40 or more steps times its first 12 steps under each host-allocator "
        "setting (4 timed steps each) and keeps the faster, then (`matmul_backend=auto`) 12 "
        "steps under each matmul backend; its tokens/s is the median after the trials.",
        "",
        f"Command of the first run: `{runs[0]['command']}`",
    ]
    payload = {"variants": variants, "runs": runs}
    print(write_results(args.name, meta, payload, f"jaxstack-train A/B: {args.name}", lines))


if __name__ == "__main__":
    main()
