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
import time
from collections.abc import Callable, Sequence
from typing import Any

from jaxstack import ckptlib
from jaxstack.rl import arithmetic
from jaxstack.rl._src.config import load_config
from jaxstack.rl._src.encode import Encoder, build_chat_template
from jaxstack.rl._src.online import grpo
from jaxstack.rl._src.sft import sft

_OPERATIONS = {"addition": "+", "multiplication": "*"}


def accuracy(prompts: Sequence[str], completions: Sequence[str]) -> dict[str, float]:
    """Exact-match accuracy over all `prompts` ("all") and per operation, so that a gain on
    the easy sums cannot hide a loss on the products."""
    right = [arithmetic.exact_answer(p, c) for p, c in zip(prompts, completions, strict=True)]
    out = {"all": sum(right) / len(right)}
    for name, symbol in _OPERATIONS.items():
        part = [r for p, r in zip(prompts, right, strict=True) if symbol in p]
        if part:
            out[name] = sum(part) / len(part)
    return out


def evaluate_model(
    path: pathlib.Path, prompts: Sequence[str], max_new_tokens: int
) -> dict[str, float]:
    """Greedy exact-match accuracy (`accuracy`) of the HF-layout model at `path`, on the
    serving engine."""
    from jaxstack import datalib
    from jaxstack.serving import LLM, SamplingParams

    tokenizer = datalib.ByteTokenizer()
    encoder = Encoder(tokenizer, build_chat_template(None))
    llm = LLM(str(path), tokenizer, max_num_seqs=64)
    outputs = llm.generate(
        [[int(t) for t in encoder.prompt(p)] for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
    )
    return accuracy(prompts, [o.outputs[0].text for o in outputs])


def _curve_point(acc: dict[str, float]) -> dict[str, float]:
    return {"accuracy": acc["all"], **{k: v for k, v in acc.items() if k != "all"}}


def _describe(acc: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.1%}" for k, v in acc.items() if k != "all")
    return f"{acc['all']:.1%} ({parts})"


def _summed_metrics(run_dir: pathlib.Path, *names: str) -> dict[str, float]:
    """`names` summed over a run's steps (compiles included), read back from its metrics so
    that a resumed stage still counts the time of its first attempt."""
    from jaxstack.trainer import read_jsonl

    steps = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"}
    return {name: sum(r.get(name, 0.0) for r in steps.values()) for name in names}


class _Clock:
    """Wall time since the recipe started, and the seconds spent in each named phase."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.phases: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, adding the time of each call to `phase`."""

        def call(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - t

        return call


def _phases(clock: _Clock, sft_s: float, grpo: dict[str, float]) -> dict[str, float]:
    """Where the recipe's wall time went: SFT's steps, GRPO's rollouts (weight hand-off and
    sampling) and updates, the evaluations (SFT's validation and every held-out accuracy), and
    the rest (problem generation, start-up, reward scoring, checkpoints, exports). Step times
    include the evaluations run inside a step, so those are taken out of "sft" and counted once.
    A resumed recipe counts its earlier attempt's steps too, and "other" can then go negative."""
    evaluation = clock.phases.get("sft_validation", 0.0) + clock.phases.get(
        "heldout_evaluation", 0.0
    )
    phases = {
        "sft": sft_s - clock.phases.get("sft_validation", 0.0),
        "rollouts": grpo["rollout_s"],
        "updates": grpo["update_s"],
        "evaluation": evaluation,
    }
    phases["other"] = clock.elapsed() - sum(phases.values())
    return phases


def run_arithmetic(
    out_dir: str | pathlib.Path,
    *,
    sft_overrides: Sequence[str] = (),
    grpo_overrides: Sequence[str] = (),
    num_train: int = 3800,
    num_eval: int = 500,
    num_validation: int = 200,
    sft_target: float = 0.3,
    seed: int = 0,
    difficulty: arithmetic.Difficulty = arithmetic.DEFAULT_DIFFICULTY,
    log: Any = print,
) -> dict[str, Any]:
    """Runs the recipe in `out_dir`; returns (and writes to recipe.json) the results.

    SFT stops at the first evaluation (every `eval.every` steps) where greedy exact match on
    `num_validation` problems, disjoint from the `num_eval` held-out ones, reaches
    `sft_target`, or after its `train.steps`. A small model learns these sums abruptly, after a
    number of steps that moves with the data and the CPU's floating-point reductions; a fixed
    step count can land on either side of that jump, a target lands within it, where some
    samples are right for most problems and GRPO has something to reinforce.
    """
    clock = _Clock()
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = arithmetic.split(
        num_train + num_validation, num_eval, seed=seed, difficulty=difficulty
    )
    validation, train = train[:num_validation], train[num_validation:]
    arithmetic.write_jsonl(out / "sft.jsonl", train, with_answers=True)
    arithmetic.write_jsonl(out / "prompts.jsonl", train, with_answers=False)

    sft_config = load_config(
        "sft",
        "arithmetic-sft",
        [f"data.path={out / 'sft.jsonl'}", f"log.run_dir={out / 'sft'}", *sft_overrides],
    )
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

    def validate(step: int, generate) -> dict[str, float]:
        acc = accuracy(validation, generate(validation))
        log(f"SFT step {step}: validation accuracy {_describe(acc)}")
        return {"validation_accuracy": acc["all"]}

    sft_result = sft(
        sft_config,
        evaluate=clock.timed("sft_validation", validate),
        stop=lambda _, metrics: metrics.get("validation_accuracy", 0.0) >= sft_target,
        max_new_tokens=max_new,
    )
    sft_s = _summed_metrics(out / "sft", "step_time_s")["step_time_s"]
    held_out_accuracy = clock.timed("heldout_evaluation", evaluate_model)
    before = held_out_accuracy(out / "sft" / "model", held_out, max_new)
    log(f"held-out exact-match accuracy after SFT: {_describe(before)} ({len(held_out)} problems)")

    curve = [{"iteration": 0, "elapsed_s": clock.elapsed(), **_curve_point(before)}]

    def evaluate(iteration: int, generate) -> dict[str, float]:
        acc = accuracy(held_out, generate(held_out))
        curve.append({"iteration": iteration, "elapsed_s": clock.elapsed(), **_curve_point(acc)})
        log(f"iteration {iteration}: held-out accuracy {_describe(acc)} ({clock.elapsed():.0f} s)")
        return {"heldout_accuracy": acc["all"]}

    result = grpo(grpo_config, evaluate=clock.timed("heldout_evaluation", evaluate))
    grpo_times = _summed_metrics(out / "grpo", "step_time_s", "rollout_s", "update_s")
    after = held_out_accuracy(out / "grpo" / "model", held_out, max_new)
    log(f"held-out exact-match accuracy after GRPO: {_describe(after)} (SFT: {_describe(before)})")
    phases = _phases(clock, sft_s, grpo_times)
    spent = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items())
    log(f"{clock.elapsed():.0f} s in all: {spent}")
    summary = {
        "num_train_problems": len(train),
        "num_heldout_problems": len(held_out),
        "num_validation_problems": len(validation),
        "sft_target": sft_target,
        "sft_steps": sft_result.step,
        "heldout_multiplications": sum("*" in p for p in held_out),
        "difficulty": vars(difficulty),
        "accuracy_sft": before["all"],
        "accuracy_grpo": after["all"],
        "gain_points": 100 * (after["all"] - before["all"]),
        "accuracy_by_operation": {"sft": before, "grpo": after},
        "sft_s": sft_s,
        "grpo_s": grpo_times["step_time_s"],
        "phases_s": phases,
        "wall_s": clock.elapsed(),
        "grpo_iterations": result.step,
        "curve": curve,
        "sft_config": sft_config.to_dict(),
        "grpo_config": grpo_config.to_dict(),
    }
    with ckptlib.atomic_file(out / "recipe.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=1))
    return summary
