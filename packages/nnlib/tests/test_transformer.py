import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from nnlib_testutil import SMALL, batch, forward, make, max_diff, stacked_copy

from jaxstack import nnlib


def test_forward_shapes_and_dtype():
    model = make()
    tokens, positions = batch()
    logits, cache = forward(model, tokens, positions)
    assert logits.shape == (2, 12, 97) and logits.dtype == jnp.float32 and cache is None
    logits, cache, aux = forward(model, tokens, positions, return_aux=True)
    assert aux == {}


def test_scan_layers_computes_the_same_function():
    model = make()
    scanned = stacked_copy(model)
    tokens, positions = batch()
    assert (
        max_diff(forward(model, tokens, positions)[0], forward(scanned, tokens, positions)[0])
        < 1e-5
    )
    kernel = nnx.state(scanned, nnx.Param)["layers"]["attn"]["q_proj"]["kernel"]
    assert kernel.shape == (2, 32, 4, 8)


def test_packed_documents_match_separate_runs():
    """Packing two documents in a row gives each document the logits it gets alone."""
    model = make()
    doc_a, _ = batch(1, 5, seed=3)
    doc_b, _ = batch(1, 4, seed=4)
    pad = jnp.zeros((1, 3), jnp.int32)
    tokens = jnp.concatenate([doc_a, doc_b, pad], axis=1)
    positions = jnp.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 0]], jnp.int32)
    segments = jnp.array([[1] * 5 + [2] * 4 + [0] * 3], jnp.int32)
    packed, _ = forward(model, tokens, positions, segments)
    # Each document alone, at the start of the row, padded with garbage tokens (segment 0).
    alone_a, _ = forward(
        model,
        jnp.concatenate([doc_a, doc_b + 1, pad + 5], 1),
        positions,
        jnp.array([[1] * 5 + [0] * 7], jnp.int32),
    )
    alone_b, _ = forward(
        model,
        jnp.concatenate([doc_b, doc_a, pad + 7], 1),
        jnp.array([[0, 1, 2, 3] + [0] * 8], jnp.int32),
        jnp.array([[3] * 4 + [0] * 8], jnp.int32),
    )
    assert max_diff(packed[:, :5], alone_a[:, :5]) < 1e-5
    assert max_diff(packed[:, 5:9], alone_b[:, :4]) < 1e-5
    assert np.all(np.isfinite(np.asarray(packed)))


@pytest.mark.parametrize("remat", ["full", pytest.param("save_dots", marks=pytest.mark.slow)])
def test_remat_keeps_gradients(remat):
    tokens, positions = batch()
    grads = []
    for policy in ("none", remat):
        apply, params = nnlib.as_function(make(remat=policy, scan_layers=True))
        loss = lambda p, f=apply: f(p, tokens, positions)[0].mean()
        grads.append(jax.jit(jax.grad(loss))(params))
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
        assert max_diff(a, b) < 1e-6


def test_bfloat16_compute_with_float32_params():
    model = make(dtype="bfloat16")
    tokens, positions = batch()
    assert nnx.state(model, nnx.Param)["embed"][...].dtype == jnp.float32
    logits16, _ = forward(model, tokens, positions)
    ref = make()
    logits32, _ = forward(ref, tokens, positions)
    assert logits16.dtype == jnp.float32
    assert max_diff(logits16, logits32) < 0.05 * float(jnp.abs(logits32).max()) + 0.02


def test_family_switches_change_the_parameter_tree():
    gemma2 = nnlib.Transformer(nnlib.get_preset("tiny-gemma2"), rngs=nnx.Rngs(0))
    names = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(gemma2, nnx.Param))}
    assert "layers/0/post_attn_norm/scale" in names and "lm_head/kernel" not in names
    qwen = nnlib.Transformer(nnlib.get_preset("tiny-qwen3"), rngs=nnx.Rngs(0))
    names = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(qwen, nnx.Param))}
    assert "layers/1/attn/q_norm/scale" in names
    with pytest.raises(nnlib.ConfigError, match="scan_layers=True needs one attention window"):
        nnlib.Transformer(
            nnlib.get_preset("tiny-gemma2").replace(scan_layers=True), rngs=nnx.Rngs(0)
        )


def test_sliding_window_limits_the_receptive_field():
    model = make(sliding_window=3)
    tokens, positions = batch(1, 10)
    base, _ = forward(model, tokens, positions)
    changed, _ = forward(model, tokens.at[0, 0].set((tokens[0, 0] + 1) % 97), positions)
    # 2 layers x window 3: token 0 can reach at most position 4.
    assert max_diff(base[:, 5:], changed[:, 5:]) == 0.0
    assert max_diff(base[:, 1:5], changed[:, 1:5]) > 0.0


def test_soft_cap_bounds_the_logits():
    model = make(final_logit_soft_cap=0.5, init_std=0.5)
    tokens, positions = batch()
    assert float(jnp.abs(forward(model, tokens, positions)[0]).max()) <= 0.5


def test_custom_attention_fn_is_used():
    calls = []

    def attention_fn(q, k, v, **kw):
        calls.append(kw)
        return nnlib.dot_product_attention(q, k, v, **kw)

    model = nnlib.Transformer(SMALL, rngs=nnx.Rngs(0), attention_fn=attention_fn)
    ref = make()
    tokens, positions = batch()
    assert max_diff(forward(model, tokens, positions)[0], forward(ref, tokens, positions)[0]) == 0.0
    assert len(calls) == 2 and calls[0]["causal"] is True and calls[0]["scale"] == 8**-0.5
