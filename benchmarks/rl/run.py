"""jaxstack-rl on CPU: one GRPO iteration's time split, and the arithmetic recipe's accuracy.

    python benchmarks/rl/run.py grpo      # a few minutes: rollout tokens/s, update steps/s,
                                           # share of an iteration in rollout vs update
    python benchmarks/rl/run.py recipe    # up to ~30 min on 2 idle cores: SFT then GRPO,
                                           # held-out exact-match accuracy curve

Each part writes `results-<part>.json` (with the run conditions measured by
benchmarks/conditions.py), then results.json and results.md are rebuilt from all parts;
`run.py report` only rebuilds them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import conditions_markdown, measure_conditions

HERE = pathlib.Path(__file__).parent
PACKAGES = ["jax", "jaxlib", "flax", "jaxstack-rl", "jaxstack-serving", "jaxstack-trainer"]


def grpo_iterations(iterations: int, warmup: int) -> dict:
    """GRPO on arithmetic prompts from a freshly initialised recipe-sized model."""
    from jaxstack import rl
    from jaxstack.trainer import read_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        train, _ = rl.arithmetic.split(2000, 0, seed=0)
        rl.arithmetic.write_jsonl(tmp / "prompts.jsonl", train, with_answers=False)
        sft_model = rl.load_config("sft", "arithmetic-sft").base.model
        overrides = [
            f"data.path={tmp / 'prompts.jsonl'}",
            f"log.run_dir={tmp / 'run'}",
            f"train.steps={iterations}",
            "checkpoint.enabled=false",
            "log.report=false",
            *(f"model.{k}={v}" for k, v in sft_model.items()),
        ]
        config = rl.load_config("grpo", "arithmetic-grpo", overrides)
        rl.grpo(config)
        records = [r for r in read_jsonl(tmp / "run" / "metrics.jsonl") if r["kind"] == "train"]
    steady = records[warmup:]
    med = lambda key: statistics.median(r[key] for r in steady)
    updates = config.grpo.updates_per_iteration
    return {
        "settings": {
            "model": dict(config.base.model),
            "prompts_per_iteration": config.base.data.batch_size,
            "group_size": config.rollout.group_size,
            "max_new_tokens": config.rollout.max_new_tokens,
            "seq_len": config.base.data.seq_len,
            "updates_per_iteration": updates,
            "iterations": iterations,
            "warmup_iterations_excluded": warmup,
        },
        "median_iteration_s": med("step_time_s"),
        "median_rollout_s": med("rollout_s"),
        "median_update_s": med("update_s"),
        "median_rollout_tokens_per_sec": med("rollout_tokens_per_sec"),
        "median_completion_tokens": med("completions/mean_length"),
        "update_steps_per_sec": updates / med("update_s"),
        "rollout_share": statistics.median(r["rollout_s"] / r["step_time_s"] for r in steady),
        "update_share": statistics.median(r["update_s"] / r["step_time_s"] for r in steady),
    }


def recipe(out_dir: str | None) -> dict:
    from jaxstack import rl

    out = pathlib.Path(out_dir or tempfile.mkdtemp(prefix="rl-recipe-"))
    summary = rl.run_arithmetic(out)
    keep = (
        "num_train_problems",
        "num_heldout_problems",
        "num_validation_problems",
        "heldout_multiplications",
        "sft_target",
        "sft_steps",
        "difficulty",
        "accuracy_sft",
        "accuracy_grpo",
        "gain_points",
        "accuracy_by_operation",
        "sft_s",
        "grpo_s",
        "phases_s",
        "wall_s",
        "curve",
    )
    result = {k: summary[k] for k in keep}
    result["settings"] = {"sft": summary["sft_config"], "grpo": summary["grpo_config"]}
    return result


def _minutes(seconds: float | None) -> str:
    return "not recorded" if seconds is None else f"{seconds / 60:.1f} min"


def _time_spent(recipe: dict) -> str:
    """The recipe's wall time by phase (runs before jaxstack-rl 0.5.1 kept only SFT and GRPO)."""
    if "phases_s" not in recipe:
        return f"SFT {recipe['sft_s']:.0f} s, GRPO {recipe['grpo_s']:.0f} s."
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in recipe["phases_s"].items())
    return f"{recipe['wall_s'] / 60:.1f} min in all: {phases}."


def markdown(results: dict) -> str:
    lines = ["# jaxstack-rl benchmark results", "", "Written by `benchmarks/rl/run.py`.", ""]
    if "grpo" in results:
        g, c = results["grpo"], results["grpo"]["conditions"]
        s = g["settings"]
        lines += [
            "## One GRPO iteration on CPU",
            "",
            conditions_markdown(c),
            "",
            f"Model {s['model']}; {s['prompts_per_iteration']} prompts x {s['group_size']} "
            f"completions of at most {s['max_new_tokens']} tokens, rows of {s['seq_len']}, "
            f"{s['updates_per_iteration']} update(s) per iteration; medians over iterations "
            f"{s['warmup_iterations_excluded'] + 1}-{s['iterations']} (compiles excluded).",
            "",
            "| rollout tokens/s | update steps/s | iteration s | rollout s | update s | "
            "rollout share | update share |",
            "|---|---|---|---|---|---|---|",
            f"| {g['median_rollout_tokens_per_sec']:,.0f} | {g['update_steps_per_sec']:.2f} | "
            f"{g['median_iteration_s']:.3f} | {g['median_rollout_s']:.3f} | "
            f"{g['median_update_s']:.3f} | {g['rollout_share']:.0%} | {g['update_share']:.0%} |",
            "",
        ]
    if "recipe" in results:
        r, c = results["recipe"], results["recipe"]["conditions"]
        lines += [
            "## `jaxstack-rl recipe arithmetic`",
            "",
            conditions_markdown(c),
            "",
            f"{r['num_train_problems']} training problems, {r['num_heldout_problems']} held out "
            f"({r['heldout_multiplications']} of them multiplications; difficulty "
            f"{r['difficulty']}). SFT stopped after {r['sft_steps']} steps, at the first "
            f"evaluation with >= {r['sft_target']:.0%} exact match on "
            f"{r['num_validation_problems']} validation problems. {_time_spent(r)}",
            "",
            f"Held-out exact match: **{r['accuracy_sft']:.1%} after SFT -> "
            f"{r['accuracy_grpo']:.1%} after GRPO ({r['gain_points']:+.1f} points)**.",
            "",
            "| GRPO iteration | wall time | held-out accuracy | additions | multiplications |",
            "|---|---|---|---|---|",
            *(
                f"| {p['iteration']} | {_minutes(p.get('elapsed_s'))} | {p['accuracy']:.1%} | "
                f"{p['addition']:.1%} | {p['multiplication']:.1%} |"
                for p in r["curve"]
            ),
            "",
        ]
    if "vs-trl" in results:
        v = results["vs-trl"]
        s, peers = v["settings"], v.get("trl_versions", {})
        runs = {a: v[a]["conditions"] for a in ("dpo", "sft", "grpo") if a in v}
        lines += ["## Side by side with TRL (`vs_trl.py`)", ""]
        for a, c in runs.items():
            lines += [f"{a.upper()}: {conditions_markdown(c)}", ""]
        lines += [
            f"One HF folder (tiny-sft's model, d_model 64 x 2 layers, byte-level), the tiny-dpo / "
            f"tiny-sft records, batch {s['batch_size']}, lr {s['learning_rate']} constant, fp32, "
            f"no clipping, no packing, DPO reference live; medians over each side's steps "
            f"after the first 5. TRL {peers.get('trl', '?')}, transformers "
            f"{peers.get('transformers', '?')}, torch {peers.get('torch', '?')}.",
            "",
            "| algorithm | steps a side | jaxstack steps/s | TRL steps/s | jaxstack / TRL |",
            "|---|---|---|---|---|",
            *(
                f"| {a.upper()} | {v[a]['steps']} | "
                f"{v[a]['jaxstack_steps_per_sec']:.2f} | {v[a]['trl_steps_per_sec']:.2f} | "
                f"{v[a]['ratio']:.2f}x |"
                for a in runs
            ),
            "",
        ]
        if "grpo" in v:
            g = v["grpo"]
            lines += [
                f"GRPO: {s.get('grpo_batch', '16 prompts x 8 completions of <= 4 tokens')} per "
                f"iteration, KL 0.04; samples/s jaxstack {g['jaxstack_samples_per_sec']:.1f}, "
                f"TRL {g['trl_samples_per_sec']:.1f} (TRL generates with HF `generate`).",
                "",
            ]
    return "\n".join(lines)


def write_report(folder: pathlib.Path = HERE) -> str:
    """results.json and results.md in `folder` from every part's `results-<part>.json` there
    (parts may be measured in separate, even concurrent, runs)."""
    path = folder / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for part in sorted(folder.glob("results-*.json")):
        results[part.stem.removeprefix("results-")] = json.loads(part.read_text())
    path.write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    (folder / "results.md").write_text(text)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["grpo", "recipe", "report"])
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out-dir", help="recipe: keep its run folders here")
    p.add_argument(
        "--out", type=pathlib.Path, default=HERE, help="folder of the results files (default: here)"
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part != "report":
        with measure_conditions(packages=PACKAGES) as conditions:
            if args.part == "grpo":
                result = grpo_iterations(args.iterations, args.warmup)
            else:
                result = recipe(args.out_dir)
        result["conditions"] = conditions.as_dict()
        (args.out / f"results-{args.part}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(write_report(args.out))


if __name__ == "__main__":
    main()
