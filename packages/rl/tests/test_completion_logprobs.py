"""GRPO's log-probs at the completion positions only equal the full-logits ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import rl
from jaxstack.rl._src import losses
from jaxstack.rl._src.encode import sequence_batch, trim_padding
from jaxstack.rl._src.policy import build_policy


@pytest.fixture
def rows(tiny):
    """A policy with random weights and rollout rows: prompts of 3-9 tokens, completions of
    0-4 (one cut at seq_len), one row dropped (its loss mask zeroed, as after a raising reward)."""
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


def test_the_positions_are_the_loss_mask_tokens_padded_to_a_power_of_two(rows):
    _, _, batch = rows
    mask = batch["loss_mask"]
    index = rl.completion_positions(mask)
    assert index.shape == (64,) and mask.sum() == 11
    assert index[:11].tolist() == np.flatnonzero(mask.reshape(-1)).tolist()
    assert (index[11:] == mask.size).all()  # padding names no position

    def count(tokens, rows=64, columns=16):
        mask = np.zeros((rows, columns), np.float32)
        mask.reshape(-1)[:tokens] = 1.0
        return rl.completion_positions(mask).shape[0]

    assert [count(n) for n in (0, 64, 65, 128, 129, 600)] == [64, 64, 128, 128, 256, 1024]
    assert count(64 * 16) == count(1000) == 64 * 16  # never more than the batch's positions
    assert count(5, rows=2, columns=16) == 32


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_log_probs_equal_the_full_logits_ones(rows, temperature):
    policy, params, batch = rows
    full = np.asarray(rl.token_logprobs(policy.apply, params, batch, temperature))
    batch = {**batch, "completion_index": rl.completion_positions(batch["loss_mask"])}
    logps = np.asarray(rl.completion_logprobs(policy.apply, params, batch, temperature))
    mask = batch["loss_mask"] > 0
    np.testing.assert_allclose(logps[mask], full[mask], rtol=0, atol=1e-6)
    assert np.abs(full[mask]).min() > 0.01  # real log-probs, not zeros on both sides
    assert (logps[~mask] == 0.0).all()


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_grpo_loss_and_gradients_are_those_of_the_full_logits(rows, loss_type, packed):
    """Also with the rows packed into one row (GRPO's update): six segments that must not see
    each other, at positions that restart."""
    policy, params, batch = rows
    batch = trim_padding(batch)
    window_batch = {**batch, "completion_index": rl.completion_positions(batch["loss_mask"])}
    if packed:
        window_batch = rl.pack_rows(batch)
        assert window_batch["packed_tokens"].shape == (1, 64)
    advantages = jnp.asarray([1.0, -0.5, 0.3, -1.0, 0.7, 2.0])
    ref_params = jax.tree.map(lambda x: 0.9 * x, params)
    settings = dict(clip_eps=0.2, kl_coef=0.04, loss_type=loss_type, max_tokens=4)

    def full(p):
        logps = rl.token_logprobs(policy.apply, p, batch, 0.7)
        ref = rl.token_logprobs(policy.apply, ref_params, batch, 0.7)
        old = jax.lax.stop_gradient(logps) + 0.1  # off-policy: ratios away from 1
        return losses.grpo_loss(logps, old, ref, advantages, batch["loss_mask"], **settings)

    def window(p):
        logps = rl.completion_logprobs(policy.apply, p, window_batch, 0.7)
        ref = rl.completion_logprobs(policy.apply, ref_params, window_batch, 0.7)
        old = jax.lax.stop_gradient(logps) + 0.1
        return losses.grpo_loss(logps, old, ref, advantages, batch["loss_mask"], **settings)

    (loss_a, metrics_a), grads_a = jax.value_and_grad(full, has_aux=True)(params)
    (loss_b, metrics_b), grads_b = jax.value_and_grad(window, has_aux=True)(params)
    assert abs(float(loss_a)) > 1e-3
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-7)
    for key in metrics_a:
        np.testing.assert_allclose(
            float(metrics_b[key]), float(metrics_a[key]), rtol=1e-5, atol=1e-6
        )
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_ppo_scores_with_the_completion_log_probs(rows, tiny):
    """PPO's old log-probs, KL and advantages come from the completion positions' log-probs:
    the same numbers as from the full logits."""
    from jaxstack.rl._src.online import PpoUpdate
    from jaxstack.rl._src.placement import place_roles

    policy, params, batch = rows
    config = rl.load_config("ppo", None, [*tiny, "rollout.temperature=0.7"])
    update = PpoUpdate(config, policy, place_roles(config))
    batch = {**batch, "completion_index": rl.completion_positions(batch["loss_mask"])}
    ref_params = jax.tree.map(lambda x: 0.9 * x, params)
    ref = update.ref_logprobs(ref_params, batch)
    full_ref = rl.token_logprobs(policy.apply, ref_params, batch, 0.7)
    scores = jnp.asarray([1.0, 0.0, 0.5, -1.0, 2.0, 0.3])
    logps, _, adv, _, kl = update.prepare({**update.params, "policy": params}, batch, ref, scores)
    full = np.asarray(rl.token_logprobs(policy.apply, params, batch, 0.7))
    mask = batch["loss_mask"]
    np.testing.assert_allclose(np.asarray(logps)[mask > 0], full[mask > 0], rtol=2e-6, atol=1e-6)
    expected_kl = ((full - np.asarray(full_ref)) * mask).sum() / mask.sum()
    assert abs(expected_kl) > 1e-3
    np.testing.assert_allclose(float(kl), expected_kl, rtol=1e-5, atol=1e-7)
    assert np.isfinite(np.asarray(adv)).all()
