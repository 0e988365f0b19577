"""Batches cut to the columns their rows use: the step does less work and computes the same."""

import jax
import numpy as np

from jaxstack import rl
from jaxstack.rl._src.encode import sequence_batch, trim_padding
from jaxstack.rl._src.policy import build_policy
from jaxstack.rl._src.preference import (
    encode_pairs,
    make_dpo_loss,
    reference_logps,
    with_completion_index,
)


def rows(lengths, seq_len=64):
    """A sequence batch whose row i holds a prompt of 3 and a completion of lengths[i] - 3
    tokens: lengths[i] - 1 columns (each predicts the next token)."""
    prompts = [np.arange(1, 4)] * len(lengths)
    completions = [np.arange(10, 10 + n - 3) for n in lengths]
    return sequence_batch(prompts, completions, seq_len, pad_id=0)


def test_rows_of_nine_tokens_make_a_sixteen_column_batch():
    batch = rows([5, 9, 7])
    trimmed = trim_padding(batch)
    for key, value in batch.items():
        assert trimmed[key].shape == (3, 16)
        np.testing.assert_array_equal(trimmed[key], value[:, :16])
        assert not value[:, 16:].any()  # what was cut is padding in every row


def test_lengths_double_up_to_the_batch_width_and_a_full_row_keeps_it():
    assert trim_padding(rows([17]))["tokens"].shape == (1, 16)
    assert trim_padding(rows([18]))["tokens"].shape == (1, 32)
    assert trim_padding(rows([41]))["tokens"].shape == (1, 64)
    assert trim_padding(rows([65]))["tokens"].shape == (1, 64)
    assert trim_padding(rows([20], seq_len=24))["tokens"].shape == (1, 24)


def test_chosen_and_rejected_rows_keep_one_length_and_other_arrays_pass_through():
    chosen, rejected = rows([6, 6]), rows([6, 30])
    batch = {f"chosen_{k}": v for k, v in chosen.items()}
    batch |= {f"rejected_{k}": v for k, v in rejected.items()}
    batch["ref_chosen"] = np.zeros(2, np.float32)
    trimmed = trim_padding(batch)
    assert {v.shape for k, v in trimmed.items() if k != "ref_chosen"} == {(2, 32)}
    assert trimmed["ref_chosen"] is batch["ref_chosen"]


def test_a_dpo_loss_on_the_trimmed_batch_is_the_full_batch_loss(tmp_path, write_jsonl, tiny):
    records = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "five"},
        {"prompt": "10+7=", "chosen": "17", "rejected": "eighteen"},
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    config = rl.load_config("dpo", None, [*tiny, f"data.path={path}", "data.seq_len=64"])
    policy = build_policy(config)
    pairs = encode_pairs(config, policy)
    pairs.update(reference_logps(policy, pairs, batch_size=2))
    # a reference a little off the policy, so the loss is not DPO's constant log 2
    pairs["ref_chosen"] = pairs["ref_chosen"] - 0.5
    loss_fn = jax.jit(make_dpo_loss(config, policy))
    full_loss, _ = loss_fn(policy.params, with_completion_index(pairs))
    trimmed = with_completion_index(trim_padding(pairs))
    assert trimmed["chosen_tokens"].shape[1] < pairs["chosen_tokens"].shape[1]
    trimmed_loss, _ = loss_fn(policy.params, trimmed)
    np.testing.assert_allclose(float(trimmed_loss), float(full_loss), rtol=1e-6)
    assert abs(float(full_loss) - np.log(2)) > 1e-3


def test_grpo_rollouts_are_cut_to_their_completions_not_to_data_seq_len(
    tmp_path, write_jsonl, tiny
):
    """TRL pads a GRPO batch to its longest completion; 8-token samples of short prompts in a
    run whose data.seq_len is 64 must not cost a 64-column update."""
    from jaxstack.rl._src.online import Rollouter, as_rewards
    from jaxstack.rl._src.placement import place_roles

    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "12+34="}, {"prompt": "5*6="}])
    config = rl.load_config(
        "grpo",
        None,
        [*tiny, f"data.path={path}", "data.seq_len=64", "data.batch_size=2",
         "rollout.group_size=2", "rollout.max_new_tokens=8"],
    )  # fmt: skip
    policy = build_policy(config)
    rewards = as_rewards([lambda prompt, completion: 0.0])
    rollouts = Rollouter(config, policy, rewards, place_roles(config)).collect(policy.params, 0)
    batch = rollouts.batch
    used = int(np.flatnonzero(batch["segment_ids"].any(axis=0))[-1]) + 1
    assert used <= 32  # short prompts + 8 new tokens
    assert batch["tokens"].shape[1] < 64
    assert batch["tokens"].shape[1] >= used
    assert rollouts.rewards.shape == (4,)
