"""GRPO's groups packed with their prompt once give the log-probs, loss and gradients of the
unpacked rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import nnlib, rl
from jaxstack.rl._src import losses
from jaxstack.rl._src.encode import MIN_PACKED_WIDTH, sequence_batch, trim_padding
from jaxstack.rl._src.policy import build_policy
from jaxstack.rl._src.shared_prompt import (
    FAMILY_STRIDE,
    pack_groups,
    shared_prompt_attention,
)

GROUP = 4
PROMPTS = (3, 9, 5)
COMPLETIONS = (20, 0, 1, 7, 3, 12, 20, 20, 5, 1, 2, 9)  # two cut at seq_len, an empty one


def groups_batch(vocab, pad_id, seq_len=24):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, vocab, n).astype(np.int32) for n in PROMPTS]
    rows = [p for p in prompts for _ in range(GROUP)]
    completions = [rng.integers(3, vocab, n).astype(np.int32) for n in COMPLETIONS]
    return sequence_batch(rows, completions, seq_len, pad_id), np.array(PROMPTS)


@pytest.fixture
def rows(tiny):
    policy = build_policy(rl.load_config("grpo", None, tiny))
    keys = iter(jax.random.split(jax.random.key(0), 100))
    params = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(next(keys), x.shape), policy.params)
    batch, prompt_lengths = groups_batch(policy.model.config.vocab_size, policy.tokenizer.pad_id)
    batch["loss_mask"][5] = 0.0  # a dropped row (its reward raised)
    return policy, params, trim_padding(batch), prompt_lengths


def test_each_prompt_is_written_once_per_packed_row_its_group_uses(rows):
    _, _, batch, prompt_lengths = rows
    packed = pack_groups(batch, prompt_lengths, GROUP)
    segments = packed["packed_segment_ids"]
    tails = np.maximum(np.count_nonzero(batch["segment_ids"], 1) - prompt_lengths.repeat(GROUP), 0)
    # completion tokens after the prompt: group 0's 19 + 0 + 0 + 6 fit the first row (with
    # its 3 prompt tokens); group 1's 2 + 11 fill it to 14 columns free, so its 15 + 15 go to
    # a second row after another copy of its prompt; group 2's 4 + 0 + 1 go in the first row,
    # its 8 in the second, again after its prompt
    np.testing.assert_array_equal(tails, [19, 0, 0, 6, 2, 11, 15, 15, 4, 0, 1, 8])
    assert segments.shape == (2, MIN_PACKED_WIDTH)
    prompts_written = (segments % FAMILY_STRIDE == 0) & (segments > 0)
    np.testing.assert_array_equal(prompts_written.sum(axis=1), [3 + 9 + 5, 9 + 5])
    assert (segments > 0).sum() == prompts_written.sum() + tails.sum()
    assert (segments > 0).sum() < np.count_nonzero(batch["segment_ids"])  # fewer than the rows


def test_plain_segment_ids_mask_as_nnlib_attention():
    q, k, v = jax.random.normal(jax.random.key(1), (3, 2, 10, 4, 8))
    segments = jnp.array([[1] * 4 + [2] * 5 + [0], [1] * 10])
    np.testing.assert_allclose(
        shared_prompt_attention(q, k, v, segment_ids=segments),
        nnlib.dot_product_attention(q, k, v, segment_ids=segments),
        atol=1e-6,
    )


def test_rows_of_a_group_must_share_their_prompt(rows):
    _, _, batch, prompt_lengths = rows
    batch = {**batch, "tokens": batch["tokens"].copy()}
    batch["tokens"][GROUP + 1, 2] += 1  # group 1's second row, inside its prompt
    with pytest.raises(ValueError, match="same prompt"):
        pack_groups(batch, prompt_lengths, GROUP)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_grpo_loss_and_gradients_are_those_of_the_unpacked_rows(rows, loss_type):
    policy, params, batch, prompt_lengths = rows
    packed = pack_groups(batch, prompt_lengths, GROUP)
    shared = policy.apply_with(shared_prompt_attention)
    advantages = jnp.asarray(np.linspace(-1.5, 2.0, len(COMPLETIONS)), jnp.float32)
    ref_params = jax.tree.map(lambda x: 0.9 * x, params)
    settings = dict(clip_eps=0.2, kl_coef=0.04, loss_type=loss_type, max_tokens=20)

    def loss(p, logprobs, batch):
        logps = logprobs(p, batch)
        ref = logprobs(ref_params, batch)
        old = jax.lax.stop_gradient(logps) + 0.1  # off-policy: ratios away from 1
        return losses.grpo_loss(logps, old, ref, advantages, batch["loss_mask"], **settings)[0]

    full = lambda p, b: rl.token_logprobs(policy.apply, p, b, 0.7)
    grouped = lambda p, b: rl.completion_logprobs(shared, p, b, 0.7)
    mask = batch["loss_mask"] > 0
    np.testing.assert_allclose(
        grouped(params, packed)[mask], full(params, batch)[mask], rtol=0, atol=2e-5
    )
    want, want_grads = jax.value_and_grad(loss)(params, full, batch)
    got, got_grads = jax.value_and_grad(loss)(params, grouped, packed)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
