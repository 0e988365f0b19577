"""The built-in arithmetic task: problems, answers, the rewards GRPO learns from, and the recipe's
report."""

import json

import numpy as np
import pytest

from jaxstack import rl
from jaxstack.rl._src.online import zero_advantage_share


def test_split_is_deterministic_disjoint_and_sized():
    d = rl.arithmetic.Difficulty(add_digits=2, mul_digits=2, mul_small_digits=1, mul_share=0.5)
    train, held = rl.arithmetic.split(300, 100, seed=3, difficulty=d)
    assert (train, held) == rl.arithmetic.split(300, 100, seed=3, difficulty=d)
    assert len(set(train)) == 300 and len(set(held)) == 100
    assert not set(train) & set(held)


def test_held_out_problems_follow_the_training_mix():
    # The default sizes have only 900 distinct 2-digit x 1-digit products, which run out while
    # the 4,500 problems are drawn: held-out and training problems must still be one mix.
    train, held = rl.arithmetic.split(4000, 500, seed=0)
    share = [sum("*" in p for p in part) / len(part) for part in (train, held)]
    assert share[0] == pytest.approx(share[1], abs=0.01)


@pytest.mark.parametrize(
    ("prompt", "completion", "exact", "credit"),
    [
        ("57+38=", "95", 1.0, 1.0),
        ("57+38=", " 95 ", 1.0, 1.0),  # surrounding spaces do not count
        ("57+38=", "96", 0.0, 0.5),  # tens right, units wrong
        ("57+38=", "5", 0.0, 0.5),  # units right, the tens digit missing
        ("56*7=", "302", 0.0, 2 / 3),  # 392: hundreds and units right
        ("56*7=", "1392", 0.0, 3 / 4),  # one digit too many
        ("56*7=", "39", 0.0, 0.0),  # aligned at the units: 39 vs 92 shares no digit
        ("56*7=", "3a2", 0.0, 0.0),  # not a number
        ("56*7=", "", 0.0, 0.0),
        # a trailing "r" asks for the digits reversed (units first): 95 -> "59", 392 -> "293"
        ("57+38=r", "59", 1.0, 1.0),
        ("57+38=r", "95", 0.0, 0.0),
        ("57+38=r", "58", 0.0, 0.5),  # units right, tens wrong
        ("57+38=r", "5", 0.0, 0.5),  # units right, the tens digit missing
        ("56*7=r", "2931", 0.0, 3 / 4),  # one digit too many
        ("56*7=r", "93", 0.0, 0.0),  # aligned at the units: 93 vs 29 shares no digit
    ],
)
def test_exact_answer_and_digit_credit(prompt, completion, exact, credit):
    assert rl.arithmetic.exact_answer(prompt, completion) == exact
    assert rl.arithmetic.digit_credit(prompt, completion) == pytest.approx(credit)


def test_reversed_problems_are_the_same_problems_with_an_r():
    plain = rl.arithmetic.Difficulty(reverse_answer=False)
    reverse = rl.arithmetic.Difficulty(reverse_answer=True)
    a = rl.arithmetic.problems(50, seed=1, difficulty=plain)
    b = rl.arithmetic.problems(50, seed=1, difficulty=reverse)
    assert b == [p + "r" for p in a]
    assert rl.arithmetic.answer("99+1=r") == "001"


def test_zero_advantage_share_counts_groups_without_spread():
    rewards = np.array([1, 1, 1, 0, 0, 0, 2, 2, 5, 0, 0, 0], np.float32)
    valid = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1], np.float32)
    # groups of 3: [1 1 1] none; [0 0 0] none; [2 2 (5 skipped)] none; [0 0 0] none
    assert zero_advantage_share(rewards, valid, 3) == 1.0
    # groups of 4: [1 1 1 0] spread; [0 0 2 2] spread; [(5) 0 0 0] none
    assert zero_advantage_share(rewards, valid, 4) == pytest.approx(1 / 3)
    # groups of 2 with every reward valid: [1 1] [1 0] [0 0] [2 2] [5 0] [0 0]
    assert zero_advantage_share(rewards, np.ones_like(valid), 2) == pytest.approx(4 / 6)


def test_the_recipe_reports_its_curve_in_wall_time_and_where_the_time_went(tmp_path):
    small = [
        "train.steps=2",
        "eval.every=1",
        "data.batch_size=8",
        "checkpoint.every=2",
        "optim.schedule.warmup_steps=0",
    ]
    summary = rl.run_arithmetic(
        tmp_path,
        sft_overrides=small,
        grpo_overrides=small,
        num_train=40,
        num_eval=16,
        num_validation=8,
        sft_target=2.0,  # never reached: SFT runs its 2 steps
        log=lambda _: None,
    )
    assert [p["iteration"] for p in summary["curve"]] == [0, 1, 2]
    elapsed = [p["elapsed_s"] for p in summary["curve"]]
    assert 0 < elapsed[0] < elapsed[1] < elapsed[2] < summary["wall_s"]
    phases = summary["phases_s"]
    assert set(phases) == {"sft", "rollouts", "updates", "evaluation", "other"}
    # "other" too: no second is counted in two phases
    assert all(seconds > 0 for seconds in phases.values()), phases
    # SFT's step time holds its two validations: they count as evaluation, not as SFT
    assert phases["sft"] < summary["sft_s"]
    saved = json.loads((tmp_path / "recipe.json").read_text())
    assert saved["phases_s"] == phases
