"""Batches cut to the columns their rows use: the step does less work and computes the same."""

import numpy as np

from jaxstack import rl
from jaxstack.rl._src.encode import sequence_batch, trim_padding
from jaxstack.rl._src.policy import build_policy


def rows(lengths, seq_len=64):
    """A sequence batch whose row i holds a prompt of 3 and a completion of lengths[i] - 3
    tokens: lengths[i] - 1 columns (each predicts the next token)."""
    prompts = [np.arange(1, 4)] * len(lengths)
    completions = [np.arange(10, 10 + n - 3) for n in lengths]
    return sequence_batch(prompts, completions, seq_len, pad_id=0)


def test_rows_of_ten_tokens_make_a_twelve_column_batch():
    batch = rows([5, 10, 7])
    trimmed = trim_padding(batch)
    for key, value in batch.items():
        assert trimmed[key].shape == (3, 12)
        np.testing.assert_array_equal(trimmed[key], value[:, :12])
        assert not value[:, 12:].any()  # what was cut is padding in every row


def test_lengths_are_powers_of_two_and_three_quarters_of_one_up_to_the_batch_width():
    columns = {n: trim_padding(rows([n + 1]))["tokens"].shape[1] for n in range(1, 65)}
    assert sorted(set(columns.values())) == [8, 12, 16, 24, 32, 48, 64]
    assert columns[8] == 8 and columns[9] == 12 and columns[13] == 16 and columns[17] == 24
    assert all(n <= width for n, width in columns.items())
    assert all(width - n < width / 3 for n, width in columns.items() if n >= 8)
    assert trim_padding(rows([65]))["tokens"].shape == (1, 64)  # a full row keeps it
    assert trim_padding(rows([20], seq_len=22))["tokens"].shape == (1, 22)


def test_chosen_and_rejected_rows_keep_one_length_and_other_arrays_pass_through():
    chosen, rejected = rows([6, 6]), rows([6, 30])
    batch = {f"chosen_{k}": v for k, v in chosen.items()}
    batch |= {f"rejected_{k}": v for k, v in rejected.items()}
    batch["ref_chosen"] = np.zeros(2, np.float32)
    trimmed = trim_padding(batch)
    assert {v.shape for k, v in trimmed.items() if k != "ref_chosen"} == {(2, 32)}
    assert trimmed["ref_chosen"] is batch["ref_chosen"]


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
