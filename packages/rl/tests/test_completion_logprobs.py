"""GRPO's log-probs at the completion positions only equal the full-logits ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import rl
from jaxstack.rl._src import losses
from jaxstack.rl._src.encode import sequence_batch, trim_padding
from jaxstack.rl._src.logprobs import completion_logprobs, completion_window
from jaxstack.rl._src.policy import build_policy


@pytest.fixture
def rows(tiny):
    """A policy with random weights and rollout rows of prompts of 3-9 tokens and completions
    of 0-4 tokens, one cut at seq_len, one dropped (its loss mask zeroed, a raising reward)."""
    policy = build_policy(rl.load_config("grpo", None, tiny))
    keys = iter(jax.random.split(jax.random.key(0), 100))
    params = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(next(keys), x.shape), policy.params)
    rng = np.random.default_rng(0)
    vocab = policy.model.config.vocab_size
    prompts = [rng.integers(3, vocab, n).astype(np.int32) for n in (3, 9, 5, 9, 4, 7)]
    completions = [rng.integers(3, vocab, n).astype(np.int32) for n in (4, 4, 0, 1, 3, 2)]
    batch = sequence_batch(prompts, completions, 11, policy.tokenizer.pad_id)  # row 1 cut to 3
    batch["loss_mask"][5] = 0.0  # a dropped row
    return policy, params, batch


def test_the_window_holds_every_completion_token_and_nothing_else(rows):
    _, _, batch = rows
    index, mask = completion_window(jnp.asarray(batch["loss_mask"]), 4)
    full = batch["loss_mask"]
    assert np.asarray(mask).sum(axis=1).tolist() == full.sum(axis=1).tolist() == [4, 3, 0, 1, 3, 0]
    picked = np.take_along_axis(full, np.asarray(index), axis=1) * np.asarray(mask)
    assert picked.sum() == full.sum()
    assert completion_window(jnp.asarray(batch["loss_mask"]), 40)[0].shape == (6, 11)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_log_probs_equal_the_full_logits_ones(rows, temperature):
    policy, params, batch = rows
    full = np.asarray(rl.token_logprobs(policy.apply, params, batch, temperature))
    logps, mask = completion_logprobs(policy.apply, params, batch, 4, temperature)
    index, _ = completion_window(jnp.asarray(batch["loss_mask"]), 4)
    mask = np.asarray(mask) > 0
    expected = np.take_along_axis(full, np.asarray(index), axis=1)
    np.testing.assert_allclose(np.asarray(logps)[mask], expected[mask], rtol=0, atol=1e-6)
    assert np.abs(expected[mask]).min() > 0.01  # real log-probs, not zeros on both sides


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_grpo_loss_and_gradients_are_those_of_the_full_logits(rows, loss_type):
    policy, params, batch = rows
    batch = trim_padding(batch)
    advantages = jnp.asarray([1.0, -0.5, 0.3, -1.0, 0.7, 2.0])
    ref_params = jax.tree.map(lambda x: 0.9 * x, params)
    settings = dict(clip_eps=0.2, kl_coef=0.04, loss_type=loss_type, max_tokens=4)

    def full(p):
        logps = rl.token_logprobs(policy.apply, p, batch, 0.7)
        ref = rl.token_logprobs(policy.apply, ref_params, batch, 0.7)
        old = jax.lax.stop_gradient(logps) + 0.1  # off-policy: ratios away from 1
        return losses.grpo_loss(logps, old, ref, advantages, batch["loss_mask"], **settings)

    def window(p):
        logps, mask = completion_logprobs(policy.apply, p, batch, 4, 0.7)
        ref, _ = completion_logprobs(policy.apply, ref_params, batch, 4, 0.7)
        old = jax.lax.stop_gradient(logps) + 0.1
        return losses.grpo_loss(logps, old, ref, advantages, mask, **settings)

    (loss_a, metrics_a), grads_a = jax.value_and_grad(full, has_aux=True)(params)
    (loss_b, metrics_b), grads_b = jax.value_and_grad(window, has_aux=True)(params)
    assert abs(float(loss_a)) > 1e-3
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-7)
    for key in metrics_a:
        np.testing.assert_allclose(float(metrics_b[key]), float(metrics_a[key]), atol=1e-6)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
