"""`jaxstack-rl recipe arithmetic`: SFT a small model on arithmetic, then GRPO it.

    generate problems (train / >= 500 held-out, disjoint) -> SFT (preset arithmetic-sft)
    -> exact-match accuracy on the held-out set -> GRPO with the exact-answer reward (preset
    arithmetic-grpo), accuracy every eval.every iterations -> accuracy after

Everything lands in one folder: `sft/` and `grpo/` run directories, the problem files, and
`recipe.json` with the accuracy curve and timings.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

from jaxstack.rl._src import arithmetic
from jaxstack.rl._src.config import load_config, write_atomic
from jaxstack.rl._src.encode import Encoder, build_chat_template
from jaxstack.rl._src.online import grpo
from jaxstack.rl._src.policy import build_tokenizer
from jaxstack.rl._src.sft import sft


def accuracy(prompts: Sequence[str], completions: Sequence[str]) -> float:
    return sum(
        arithmetic.exact_answer(p, c) for p, c in zip(prompts, completions, strict=True)
    ) / len(prompts)


def evaluate_model(path: pathlib.Path, prompts: Sequence[str], max_new_tokens: int) -> float:
    """Greedy exact-match accuracy of the HF-layout model at `path`, on the serving engine."""
    from jaxstack.serving import LLM, SamplingParams

    tokenizer = build_tokenizer("byte")
    encoder = Encoder(tokenizer, build_chat_template(None))
    llm = LLM(str(path), tokenizer, max_num_seqs=64)
    outputs = llm.generate(
        [[int(t) for t in encoder.prompt(p)] for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
    )
    return accuracy(prompts, [o.outputs[0].text for o in outputs])


def _training_seconds(run_dir: pathlib.Path) -> float:
    """Seconds spent in a run's steps (compiles included, evaluations too for GRPO), summed
    over its metrics so that a resumed stage still counts the time of its first attempt."""
    from jaxstack.trainer import read_jsonl

    steps = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"}
    return sum(r["step_time_s"] for r in steps.values())


def run_arithmetic(
    out_dir: str | pathlib.Path,
    *,
    sft_overrides: Sequence[str] = (),
    grpo_overrides: Sequence[str] = (),
    num_train: int = 4000,
    num_eval: int = 500,
    seed: int = 0,
    difficulty: arithmetic.Difficulty = arithmetic.DEFAULT_DIFFICULTY,
    log: Any = print,
) -> dict[str, Any]:
    """Runs the recipe in `out_dir`; returns (and writes to recipe.json) the results."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = arithmetic.split(num_train, num_eval, seed=seed, difficulty=difficulty)
    arithmetic.write_jsonl(out / "sft.jsonl", train, with_answers=True)
    arithmetic.write_jsonl(out / "prompts.jsonl", train, with_answers=False)

    sft_config = load_config(
        "sft",
        "arithmetic-sft",
        [f"data.path={out / 'sft.jsonl'}", f"log.run_dir={out / 'sft'}", *sft_overrides],
    )
    sft(sft_config)
    sft_s = _training_seconds(out / "sft")
    grpo_config = load_config(
        "grpo",
        "arithmetic-grpo",
        [
            f"data.path={out / 'prompts.jsonl'}",
            f"init.hf={out / 'sft' / 'model'}",
            f"log.run_dir={out / 'grpo'}",
            *grpo_overrides,
        ],
    )
    max_new = grpo_config.rollout.max_new_tokens
    before = evaluate_model(out / "sft" / "model", held_out, max_new)
    log(f"held-out exact-match accuracy after SFT: {before:.1%} ({len(held_out)} problems)")

    curve = [{"iteration": 0, "accuracy": before}]

    def evaluate(iteration: int, generate) -> dict[str, float]:
        acc = accuracy(held_out, generate(held_out))
        curve.append({"iteration": iteration, "accuracy": acc})
        log(f"iteration {iteration}: held-out accuracy {acc:.1%}")
        return {"heldout_accuracy": acc}

    result = grpo(grpo_config, evaluate=evaluate)
    grpo_s = _training_seconds(out / "grpo")
    after = evaluate_model(out / "grpo" / "model", held_out, max_new)
    log(f"held-out exact-match accuracy after GRPO: {after:.1%} (SFT: {before:.1%})")
    summary = {
        "num_train_problems": len(train),
        "num_heldout_problems": len(held_out),
        "difficulty": vars(difficulty),
        "accuracy_sft": before,
        "accuracy_grpo": after,
        "gain_points": 100 * (after - before),
        "sft_s": sft_s,
        "grpo_s": grpo_s,
        "grpo_iterations": result.step,
        "curve": curve,
        "sft_config": sft_config.to_dict(),
        "grpo_config": grpo_config.to_dict(),
    }
    write_atomic(out / "recipe.json", json.dumps(summary, indent=1))
    return summary
