import jax
import jax.numpy as jnp
import numpy as np
import pytest
from nnlib_testutil import batch, forward, make, max_diff

from jaxstack import nnlib


@pytest.mark.parametrize("scan", [pytest.param(False, marks=pytest.mark.slow), True])
def test_cached_decode_matches_full_forward(scan):
    model = make(scan_layers=scan, sliding_window=5)
    tokens, positions = batch(2, 10)
    full, _ = forward(model, tokens, positions)
    cache = nnlib.ContiguousKVCache.create(model.config, 2, 16)
    assert isinstance(cache, nnlib.KVCache)
    logits, cache = forward(model, tokens[:, :6], positions[:, :6], None, cache)
    steps = [logits]
    for i in range(6, 10):
        logits, cache = forward(model, tokens[:, i : i + 1], positions[:, i : i + 1], None, cache)
        steps.append(logits)
    assert int(cache.length) == 10
    assert max_diff(jnp.concatenate(steps, axis=1), full) < 1e-5


def test_left_padded_prompt_decodes_like_the_unpadded_one():
    model = make()
    tokens, _ = batch(1, 5)
    # Row 0: 3 pad slots then the prompt; padding is segment 0, so it is never attended.
    padded = jnp.concatenate([jnp.full((1, 3), 7, jnp.int32), tokens], axis=1)
    seg = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1]], jnp.int32)
    pos = jnp.array([[0, 0, 0, 0, 1, 2, 3, 4]], jnp.int32)
    cache = nnlib.ContiguousKVCache.create(model.config, 1, 9)
    got, cache = forward(model, padded, pos, seg, cache)
    want, _ = forward(model, tokens, pos[:, 3:])
    assert max_diff(got[:, 3:], want) < 1e-5


def test_generate_greedy_equals_repeated_argmax():
    model = make()
    prompt, _ = batch(2, 4)
    out = nnlib.generate(model, prompt, 5)
    assert out.shape == (2, 9) and out.dtype == jnp.int32
    assert np.array_equal(np.asarray(out[:, :4]), np.asarray(prompt))
    seq = prompt
    apply, params = nnlib.as_function(model)
    f = jax.jit(apply)
    for _ in range(5):
        t = seq.shape[1]
        logits, _ = f(
            params, jnp.pad(seq, ((0, 0), (0, 9 - t))), jnp.broadcast_to(jnp.arange(9), (2, 9))
        )
        seq = jnp.concatenate([seq, jnp.argmax(logits[:, t - 1], -1)[:, None].astype(jnp.int32)], 1)
    assert np.array_equal(np.asarray(out), np.asarray(seq))


@pytest.mark.slow
def test_sampling_top_k_and_eos():
    model = make(init_std=0.3)
    prompt, _ = batch(2, 3)
    greedy = nnlib.generate(model, prompt, 4)
    assert np.array_equal(
        np.asarray(
            nnlib.generate(model, prompt, 4, temperature=1.0, top_k=1, rng=jax.random.key(3))
        ),
        np.asarray(greedy),
    )
    a = nnlib.generate(model, prompt, 6, temperature=5.0, rng=jax.random.key(0))
    b = nnlib.generate(model, prompt, 6, temperature=5.0, rng=jax.random.key(0))
    c = nnlib.generate(model, prompt, 6, temperature=5.0, rng=jax.random.key(1))
    assert np.array_equal(np.asarray(a), np.asarray(b)) and not np.array_equal(
        np.asarray(a), np.asarray(c)
    )
    eos = int(greedy[0, 3])
    out = nnlib.generate(model, prompt, 4, eos_id=eos)
    assert np.all(np.asarray(out[0, 3:]) == eos)
    with pytest.raises(nnlib.Error, match="needs rng"):
        nnlib.generate(model, prompt, 2, temperature=1.0)
