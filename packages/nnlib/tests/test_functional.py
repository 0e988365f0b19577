import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from nnlib_testutil import batch, forward, make, max_diff

from jaxstack import nnlib


def test_apply_matches_model_and_grads_flow_back():
    model = make()
    tokens, positions = batch()
    apply, params = nnlib.as_function(model)
    assert isinstance(params, nnx.State)
    want, _ = forward(model, tokens, positions)

    @jax.jit
    def step(params):
        loss, grads = jax.value_and_grad(lambda p: apply(p, tokens, positions)[0].mean())(params)
        return loss, jax.tree.map(lambda p, g: p - 1.0 * g, params, grads)

    logits, _ = jax.jit(apply)(params, tokens, positions)
    assert max_diff(logits, want) < 1e-6
    loss0, new = step(params)
    loss1, _ = step(new)
    assert float(loss1) < float(loss0)
    # apply never mutates the model; nnx.update puts trained params back.
    assert max_diff(forward(model, tokens, positions)[0], want) == 0.0
    nnx.update(model, new)
    assert (
        max_diff(forward(model, tokens, positions)[0], jax.jit(apply)(new, tokens, positions)[0])
        < 1e-6
    )


def test_hidden_states_method_and_wrt_filter():
    model = make()
    nnlib.apply_lora(model, r"attn/q_proj$", rank=2)
    tokens, positions = batch()
    apply, lora_params = nnlib.as_function(model, wrt=nnx.LoRAParam)
    leaves = jax.tree.leaves(lora_params)
    assert len(leaves) == 4  # a and b for two layers
    hidden, _, _ = jax.jit(apply.method("hidden_states"))(lora_params, tokens, positions)
    assert hidden.shape == (2, 12, 32)
    logits, _ = jax.jit(apply)(lora_params, tokens, positions)
    assert max_diff(logits, hidden @ nnx.state(model, nnx.Param)["lm_head"]["kernel"][...]) < 1e-4
    assert np.all(np.isfinite(np.asarray(logits)))
    g = jax.jit(jax.grad(lambda p: apply(p, tokens, positions)[0].mean()))(lora_params)
    assert jax.tree.structure(g) == jax.tree.structure(lora_params)
    assert any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(g))
