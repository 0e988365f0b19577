"""kernlib's attention plugs into nnlib's models unchanged, forward and backward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstack import kernlib, nnlib

CONFIG = nnlib.get_preset("tiny-llama").replace(vocab_size=128, max_seq_len=32)


def packed_inputs():
    tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, 128, dtype=jnp.int32)
    segment_ids = jnp.array([[1] * 20 + [2] * 9 + [0] * 3, [1] * 32], jnp.int32)
    starts = jnp.array([[0] * 20 + [20] * 9 + [29] * 3, [0] * 32], jnp.int32)
    positions = jnp.arange(32, dtype=jnp.int32)[None] - starts
    return tokens, positions, segment_ids


def loss_and_grads(attention_fn):
    model = nnlib.Transformer(CONFIG, rngs=nnx.Rngs(0), attention_fn=attention_fn)
    apply, params = nnlib.as_function(model)
    tokens, positions, segment_ids = packed_inputs()
    mask = (segment_ids > 0).astype(jnp.float32)

    def loss(params):
        logits, _ = apply(params, tokens, positions, segment_ids)
        return jnp.sum(jnp.mean(logits**2, axis=-1) * mask) / mask.sum()

    return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize(
    "attention_fn",
    [
        pytest.param(kernlib.attention, id="kernlib-auto"),
        pytest.param(
            functools.partial(kernlib.attention, implementation="pallas_triton", interpret=True),
            id="kernlib-pallas-interpret",
        ),
    ],
)
def test_kernlib_attention_matches_nnlib_default(attention_fn):
    reference_loss, reference_grads = loss_and_grads(None)
    loss, grads = loss_and_grads(attention_fn)
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
    for ref, got in zip(jax.tree.leaves(reference_grads), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-3)
