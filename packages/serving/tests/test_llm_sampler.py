"""The sampler's draw follows the row's distribution exactly, and its argmax is jnp.argmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.serving._src.llm import sampler

VOCAB = 1000  # blocks of 32: 32 blocks, the last one partly padding


def _probabilities(seed: int) -> np.ndarray:
    """A peaked distribution with masked (-inf) tokens, some alone in their block, some filling
    whole blocks, and mass in the last, partly padded block."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=VOCAB) * 2.0
    masked = np.zeros(VOCAB, bool)
    masked[rng.choice(VOCAB, 300, replace=False)] = True
    masked[64:128] = True  # two whole blocks without mass
    masked[VOCAB - 1] = False
    logits[masked] = -np.inf
    logits[VOCAB - 1] = 3.0
    return logits


def _draw_many(logits: np.ndarray, draws: int = 200_000) -> np.ndarray:
    rows = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (draws, VOCAB))
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(7), i))(jnp.arange(draws))
    return np.asarray(jax.jit(sampler.draw)(rows, keys))


def _fits(tokens: np.ndarray, logits: np.ndarray) -> bool:
    """No token of zero probability, and Pearson's chi-square within 6 sd of its mean (over the
    tokens expected 20+ times, the rest pooled): chance does not fail it, a bias does."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    if np.isin(tokens, np.flatnonzero(p == 0)).any():
        return False
    counts, expected = np.bincount(tokens, minlength=VOCAB), p * len(tokens)
    big = expected >= 20
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    chi2, dof = ((observed - wanted) ** 2 / wanted).sum(), big.sum()
    return bool(chi2 < dof + 6 * np.sqrt(2 * dof))


def test_draws_follow_the_softmax_and_never_pick_a_masked_token():
    logits = _probabilities(0)
    assert _fits(_draw_many(logits), logits)


def test_the_check_fails_a_slightly_wrong_temperature():
    logits = _probabilities(1)
    assert _fits(_draw_many(logits), logits)
    assert not _fits(_draw_many(logits / 1.05), logits)


def test_a_row_with_one_token_of_mass_always_draws_it():
    logits = np.full((4, VOCAB), -np.inf, np.float32)
    for row, token in enumerate([0, 31, 32, VOCAB - 1]):
        logits[row, token] = 0.0
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(4))
    for _ in range(3):
        assert np.asarray(sampler.draw(jnp.asarray(logits), keys)).tolist() == [0, 31, 32, 999]
        keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)


def test_first_argmax_is_jnp_argmax_ties_included():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=(64, 300)).astype(np.float32)  # many ties
    x[3] = -np.inf
    x[4, 10] = np.inf
    np.testing.assert_array_equal(sampler.first_argmax(jnp.asarray(x)), np.argmax(x, axis=-1))
