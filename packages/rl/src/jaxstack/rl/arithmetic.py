"""A verifiable task for demos, tests and benchmarks: multi-digit addition and multiplication.

Problems are generated deterministically from a seed (`"57+38="` -> `"95"`; with a trailing
`r` the answer is written units digit first, `"57+38=r"` -> `"59"`), so a run is repeatable
and a held-out set never overlaps the training set (`split` draws them from one stream and
dedups). `exact_answer` is the reward: 1.0 when the completion, stripped, is exactly
the answer, else 0.0; `digit_credit` gives partial credit per correct digit. Both recompute the
answer from the prompt, so they need no stored label.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import pathlib
import re

import numpy as np

from jaxstack.rl._src.errors import ConfigError

_OPS = {"+": operator.add, "*": operator.mul}
_PROBLEM = re.compile(r"(\d+)([+*])(\d+)=(r?)$")


@dataclasses.dataclass(frozen=True)
class Difficulty:
    """Operand sizes per operation: `add_digits`-digit sums and `mul_digits` x 1-digit
    products (the second factor has `mul_small_digits` digits); `reverse_answer` asks for the
    answer's digits units first (the prompt ends in "=r"), the order in which a carry is
    computed, which a small transformer learns in far fewer steps (Lee et al. 2023)."""

    add_digits: int = 2
    mul_digits: int = 2
    mul_small_digits: int = 1
    mul_share: float = 0.5
    reverse_answer: bool = False


DEFAULT_DIFFICULTY = Difficulty()


def answer(prompt: str) -> str:
    """The exact answer of a problem prompt like "57+38=" ("95"), or "57+38=r" ("59")."""
    m = _PROBLEM.search(prompt.strip())
    if m is None:
        raise ValueError(f"not an arithmetic problem: {prompt!r}")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    digits = str(_OPS[op](a, b))
    return digits[::-1] if m.group(4) else digits


def exact_answer(prompt: str, completion: str) -> float:
    """Reward: 1.0 if the completion is exactly the answer (surrounding spaces ignored)."""
    return 1.0 if completion.strip() == answer(prompt) else 0.0


def digit_credit(prompt: str, completion: str) -> float:
    """Partial credit: the share of the answer's digits the completion has right, aligned at
    the units digit, out of the longer of the two (so a missing or extra digit costs one).

    A completion that is not a plain number scores 0. Exact answers score 1, near misses in
    between: a group of completions that are all wrong still has a best one to learn from.
    """
    got, want = completion.strip(), answer(prompt)
    if not got.isdigit():
        return 0.0
    if prompt.strip().endswith("r"):  # units first: align at the start
        got, want = got[::-1], want[::-1]
    width = max(len(got), len(want))
    return sum(g == w for g, w in zip(got.rjust(width), want.rjust(width), strict=True)) / width


def _number(rng: np.random.Generator, digits: int) -> int:
    return int(rng.integers(10 ** (digits - 1) if digits > 1 else 0, 10**digits))


def _count(digits: int) -> int:
    return 10 if digits == 1 else 9 * 10 ** (digits - 1)


def problems(n: int, *, seed: int, difficulty: Difficulty = DEFAULT_DIFFICULTY) -> list[str]:
    """`n` distinct problem prompts drawn from the stream of `seed`."""
    d = difficulty
    distinct = _count(d.add_digits) ** 2 + _count(d.mul_digits) * _count(d.mul_small_digits)
    if n > distinct // 2:
        raise ConfigError(
            f"{n} distinct problems asked of a difficulty with {distinct}; ask for at most "
            f"{distinct // 2} or use more digits"
        )
    rng = np.random.default_rng(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        if rng.random() < difficulty.mul_share:
            a, b = _number(rng, difficulty.mul_digits), _number(rng, difficulty.mul_small_digits)
            out[f"{a}*{b}="] = None
        else:
            a, b = _number(rng, difficulty.add_digits), _number(rng, difficulty.add_digits)
            out[f"{a}+{b}="] = None
    suffix = "r" if difficulty.reverse_answer else ""
    return [p + suffix for p in out]


def split(
    num_train: int, num_eval: int, *, seed: int, difficulty: Difficulty = DEFAULT_DIFFICULTY
) -> tuple[list[str], list[str]]:
    """Disjoint (train, held-out) prompt lists from one deterministic stream, stratified so
    that both have the stream's share of multiplications. (The stream's first draws are richer
    in the scarcer products, 900 distinct ones at 2 x 1 digits, than its last: cutting it in
    order would test on another mix than the one trained on.)"""
    every = problems(num_train + num_eval, seed=seed, difficulty=difficulty)
    np.random.default_rng(seed).shuffle(every)
    products = [p for p in every if "*" in p]
    held_products = round(num_eval * len(products) / len(every))
    sums = [p for p in every if "*" not in p]
    held = set(products[:held_products] + sums[: num_eval - held_products])
    return [p for p in every if p not in held], [p for p in every if p in held]


def write_jsonl(path: str | pathlib.Path, prompts: list[str], *, with_answers: bool) -> None:
    """Prompt records (GRPO) or prompt-completion records (SFT) for `prompts`."""
    if not prompts:
        raise ConfigError("no problems to write")
    with open(path, "w") as f:
        for p in prompts:
            record = {"prompt": p, "completion": answer(p)} if with_answers else {"prompt": p}
            f.write(json.dumps(record) + "\n")
