"""DPO and ORPO score pairs packed (each prompt once, no padding) and get the numbers of the
plain padded rows scored with full logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import rl
from jaxstack.rl._src.policy import build_policy
from jaxstack.rl._src.preference import (
    PairScorer,
    encode_pairs,
    make_dpo_loss,
    make_orpo_loss,
    reference_logps,
)
from jaxstack.rl._src.shared_prompt import FAMILY_STRIDE

RECORDS = [
    {"prompt": "What is twelve plus thirty? Answer:", "chosen": " 42", "rejected": " 24"},
    {"prompt": "Name the colour of the sky:", "chosen": " blue", "rejected": " green"},
    {"prompt": "7*6=", "chosen": "42", "rejected": "forty-three"},
]
SIDES = ("chosen", "rejected")


def setup(tmp_path, write_jsonl, tiny, algorithm, overrides=()):
    """A config, its policy with random weights, and the records' encoded pairs."""
    path = write_jsonl(tmp_path / "pairs.jsonl", RECORDS)
    config = rl.load_config(
        algorithm, None, [*tiny, f"data.path={path}", "data.seq_len=64", *overrides]
    )
    policy = build_policy(config)
    keys = iter(jax.random.split(jax.random.key(1), 100))
    params = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(next(keys), x.shape), policy.params)
    return config, policy, params, encode_pairs(config, policy)


def plain_logps(policy, params, pairs, side):
    """Token log-probs and loss mask of one side's padded [N, 64] rows, from the full logits."""
    rows = {k.removeprefix(side + "_"): v for k, v in pairs.items() if k.startswith(side)}
    return rl.token_logprobs(policy.apply, params, rows), rows["loss_mask"]


def plain_sequence_logps(policy, params, pairs):
    return [rl.sequence_logprobs(*plain_logps(policy, params, pairs, s)) for s in SIDES]


def assert_same_loss_and_gradients(loss_fn, plain_loss_fn, params):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    plain_loss, plain_grads = jax.value_and_grad(plain_loss_fn)(params)
    np.testing.assert_allclose(float(loss), float(plain_loss), rtol=1e-5)
    for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-4, atol=1e-6)
    return float(loss)


def test_a_pair_batch_holds_each_prompt_once_and_no_padding(tmp_path, write_jsonl, tiny):
    _, policy, _, pairs = setup(tmp_path, write_jsonl, tiny, "dpo")
    batch = PairScorer(policy).batch(pairs, np.arange(len(RECORDS)))
    segments = batch["packed_segment_ids"]
    prompt_tokens = pairs["prompt_lengths"].sum()
    row_tokens = sum(pairs[f"{side}_segment_ids"].sum() for side in SIDES)
    assert ((segments % FAMILY_STRIDE == 0) & (segments > 0)).sum() == prompt_tokens
    assert (segments > 0).sum() == row_tokens - prompt_tokens  # each reply once after it
    assert segments.shape == (2, 64)  # 99 positions in use; the rows, trimmed: 6 x 48
    assert batch["targets"].shape == (2 * len(RECORDS), 48)


@pytest.mark.parametrize("window", [None, 8], ids=["shared-prompt", "sliding-window"])
def test_dpo_loss_and_gradients_are_those_of_the_plain_rows(tmp_path, write_jsonl, tiny, window):
    """With a sliding window the pairs pack as whole rows (`pack_rows`), not sharing prompts.
    The reference runs live, inside the loss."""
    overrides = [
        "dpo.reference=live",
        *([] if window is None else [f"model.sliding_window={window}"]),
    ]
    config, policy, params, pairs = setup(tmp_path, write_jsonl, tiny, "dpo", overrides)
    scorer = PairScorer(policy)
    assert scorer.shares_prompts == (window is None)
    ref_params = jax.tree.map(lambda x: 0.9 * x, params)
    batch = scorer.batch(pairs, np.arange(len(RECORDS))) | {"reference_params": ref_params}
    loss_fn = make_dpo_loss(config, scorer)
    ref_chosen, ref_rejected = plain_sequence_logps(policy, ref_params, pairs)

    def plain_loss(p):
        chosen, rejected = plain_sequence_logps(policy, p, pairs)
        return rl.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=config.dpo.beta)[0]

    loss = assert_same_loss_and_gradients(lambda p: loss_fn(p, batch)[0], plain_loss, params)
    assert abs(loss - np.log(2)) > 1e-3  # not DPO's constant at a zero margin


def test_orpo_loss_and_gradients_are_those_of_the_plain_rows(tmp_path, write_jsonl, tiny):
    config, policy, params, pairs = setup(tmp_path, write_jsonl, tiny, "orpo")
    scorer = PairScorer(policy)
    batch = scorer.batch(pairs, np.arange(len(RECORDS)))
    loss_fn = make_orpo_loss(config, scorer)

    def plain_loss(p):
        (chosen, chosen_mask), (rejected, rejected_mask) = (
            plain_logps(policy, p, pairs, side) for side in SIDES
        )
        nll = -(chosen * chosen_mask).sum() / chosen_mask.sum()
        mean_chosen = rl.sequence_logprobs(chosen, chosen_mask) / chosen_mask.sum(-1)
        mean_rejected = rl.sequence_logprobs(rejected, rejected_mask) / rejected_mask.sum(-1)
        return rl.orpo_loss(mean_chosen, mean_rejected, nll, beta=config.orpo.beta)[0]

    assert_same_loss_and_gradients(lambda p: loss_fn(p, batch)[0], plain_loss, params)


def test_precomputed_reference_log_probs_are_the_plain_rows(tmp_path, write_jsonl, tiny):
    """Two pairs a batch over three records: the last batch wraps around and is cut."""
    _, policy, params, pairs = setup(tmp_path, write_jsonl, tiny, "dpo")
    ref = reference_logps(PairScorer(policy), params, pairs, batch_size=2)
    chosen, rejected = plain_sequence_logps(policy, params, pairs)
    np.testing.assert_allclose(ref["ref_chosen"], chosen, rtol=1e-5)
    np.testing.assert_allclose(ref["ref_rejected"], rejected, rtol=1e-5)
    assert not jnp.allclose(chosen, rejected)
