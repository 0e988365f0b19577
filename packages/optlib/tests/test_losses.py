"""Losses: token-weighted masked cross-entropy, z-loss, label smoothing, and the chunked loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstack.optlib import ConfigError, chunked_cross_entropy_loss, cross_entropy_loss


def random_batch(b=2, t=12, v=11, d=6, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(k[0], (b, t, d))
    w = jax.random.normal(k[1], (d, v)) * 0.7
    targets = jax.random.randint(k[2], (b, t), 0, v)
    mask = (jax.random.uniform(k[3], (b, t)) > 0.3).astype(jnp.float32)
    return hidden, w, targets, mask


def test_cross_entropy_is_the_token_weighted_mean_over_masked_tokens():
    _, _, targets, mask = random_batch()
    logits = jax.random.normal(jax.random.key(1), (*targets.shape, 11)) * 3
    loss, metrics = cross_entropy_loss(logits, targets, mask)
    per_token = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    expected = float(jnp.sum(per_token * mask) / jnp.sum(mask))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(metrics["cross_entropy"]) == pytest.approx(expected, rel=1e-6)
    assert float(metrics["num_tokens"]) == float(mask.sum())
    assert float(metrics["z_loss"]) == 0.0


def test_packed_segments_weigh_by_tokens_and_padding_counts_for_nothing():
    # One row packing a 6-token and a 2-token document, then 4 padding tokens (segment 0).
    segment_ids = jnp.array([[1, 1, 1, 1, 1, 1, 2, 2, 0, 0, 0, 0]])
    mask = (segment_ids > 0).astype(jnp.float32)
    targets = jnp.zeros((1, 12), jnp.int32)
    vocab = 5
    # Document 1 is predicted with p=1/5 (logits 0), document 2 perfectly-ish, padding terribly.
    logits = jnp.zeros((1, 12, vocab))
    logits = logits.at[0, 6:8, 0].set(20.0).at[0, 8:, 1].set(1e4)
    loss, metrics = cross_entropy_loss(logits, targets, mask)
    doc1, doc2 = np.log(5.0), float(jax.nn.logsumexp(jnp.array([20.0, 0, 0, 0, 0])) - 20.0)
    assert float(loss) == pytest.approx((6 * doc1 + 2 * doc2) / 8, rel=1e-5)
    assert float(loss) != pytest.approx((doc1 + doc2) / 2, rel=1e-2)  # not a per-document mean
    assert float(metrics["num_tokens"]) == 8.0
    # Masked tokens get no gradient.
    grads = jax.grad(lambda x: cross_entropy_loss(x, targets, mask)[0])(logits)
    assert not jnp.any(grads[0, 8:])


def test_all_masked_batch_gives_zero_not_nan():
    logits = jnp.ones((1, 3, 4))
    loss, metrics = cross_entropy_loss(logits, jnp.zeros((1, 3), jnp.int32), jnp.zeros((1, 3)))
    assert float(loss) == 0.0 and float(metrics["num_tokens"]) == 0.0


def test_z_loss_and_label_smoothing():
    _, _, targets, mask = random_batch()
    logits = jax.random.normal(jax.random.key(2), (*targets.shape, 11)) * 2 + 1.5
    lse = jax.nn.logsumexp(logits, -1)
    loss, metrics = cross_entropy_loss(logits, targets, mask, z_loss_weight=1e-2)
    z = float(1e-2 * jnp.sum(lse**2 * mask) / mask.sum())
    assert float(metrics["z_loss"]) == pytest.approx(z, rel=1e-6)
    assert float(loss) == pytest.approx(float(metrics["cross_entropy"]) + z, rel=1e-6)

    smooth = optax.smooth_labels(jax.nn.one_hot(targets, 11), 0.1)
    expected = jnp.sum(optax.softmax_cross_entropy(logits, smooth) * mask) / mask.sum()
    loss, metrics = cross_entropy_loss(logits, targets, mask, label_smoothing=0.1)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    plain, _ = cross_entropy_loss(logits, targets, mask)
    assert float(metrics["cross_entropy"]) == pytest.approx(float(plain), rel=1e-6)


def test_bfloat16_logits_are_reduced_in_float32():
    _, _, targets, mask = random_batch()
    logits = jax.random.normal(jax.random.key(3), (*targets.shape, 11)) * 4
    loss16, _ = cross_entropy_loss(logits.astype(jnp.bfloat16), targets, mask)
    loss32, _ = cross_entropy_loss(logits.astype(jnp.bfloat16).astype(jnp.float32), targets, mask)
    assert loss16.dtype == jnp.float32 and float(loss16) == float(loss32)


@pytest.mark.parametrize(
    ("chunk_size", "z", "smoothing", "cap"),
    [(5, 0.0, 0.0, None), (8, 1e-3, 0.1, None), (24, 1e-3, 0.0, 2.0), (100, 0.0, 0.0, None)],
)
def test_chunked_matches_naive_loss_and_gradients(chunk_size, z, smoothing, cap):
    hidden, w, targets, mask = random_batch()

    def naive(h, w):
        logits = jnp.einsum("btd,dv->btv", h, w)
        if cap is not None:
            logits = cap * jnp.tanh(logits / cap)
        return cross_entropy_loss(logits, targets, mask, z_loss_weight=z, label_smoothing=smoothing)

    def chunked(h, w):
        return chunked_cross_entropy_loss(
            h,
            w,
            targets,
            mask,
            chunk_size=chunk_size,
            z_loss_weight=z,
            logits_soft_cap=cap,
            label_smoothing=smoothing,
        )

    (l1, m1), g1 = jax.value_and_grad(naive, argnums=(0, 1), has_aux=True)(hidden, w)
    (l2, m2), g2 = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True))(hidden, w)
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    for key in m1:
        np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, atol=1e-7)
    for a, b in zip(g1, g2, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_chunked_bfloat16_weights_accumulate_gradients_in_float32():
    hidden, w, targets, mask = random_batch(t=64, v=32)
    h16, w16 = hidden.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    loss_fn = lambda h, w: chunked_cross_entropy_loss(h, w, targets, mask, chunk_size=16)[0]
    ref = jax.grad(loss_fn, argnums=1)(h16.astype(jnp.float32), w16.astype(jnp.float32))
    got = jax.grad(loss_fn, argnums=1)(h16, w16)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), ref, rtol=2e-2, atol=2e-3)


def test_chunked_loss_peak_memory_is_independent_of_the_token_count():
    """Compiled temp memory (no execution): naive grows with B*T*V, chunked with chunk*V."""
    b, t, v, d, chunk = 4, 1024, 4096, 64, 256
    args = (
        jax.ShapeDtypeStruct((b, t, d), jnp.float32),
        jax.ShapeDtypeStruct((d, v), jnp.float32),
        jax.ShapeDtypeStruct((b, t), jnp.int32),
        jax.ShapeDtypeStruct((b, t), jnp.float32),
    )

    def naive(h, w, y, m):
        return cross_entropy_loss(jnp.einsum("btd,dv->btv", h, w), y, m)[0]

    def chunked(h, w, y, m):
        return chunked_cross_entropy_loss(h, w, y, m, chunk_size=chunk)[0]

    def temp_bytes(fn):
        compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*args).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    logits_bytes = b * t * v * 4
    naive_bytes, chunked_bytes = temp_bytes(naive), temp_bytes(chunked)
    assert naive_bytes >= logits_bytes
    assert chunked_bytes < logits_bytes / 4
    assert chunked_bytes * 4 <= naive_bytes


def test_loss_option_errors():
    hidden, w, targets, mask = random_batch()
    with pytest.raises(ConfigError, match="z_loss_weight must be >= 0"):
        cross_entropy_loss(jnp.zeros((2, 12, 11)), targets, z_loss_weight=float("nan"))
    with pytest.raises(ConfigError, match="label_smoothing"):
        cross_entropy_loss(jnp.zeros((2, 12, 11)), targets, label_smoothing=1.0)
    with pytest.raises(ConfigError, match="loss_mask shape"):
        cross_entropy_loss(jnp.zeros((2, 12, 11)), targets, mask[:, :3])
    with pytest.raises(ConfigError, match="chunk_size"):
        chunked_cross_entropy_loss(hidden, w, targets, chunk_size=0)
    with pytest.raises(ConfigError, match=r"embedding\.T"):
        chunked_cross_entropy_loss(hidden, w.T, targets)
