import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from nnlib_testutil import max_diff

from jaxstack import nnlib

CFG = nnlib.ModelConfig(
    family="mixtral",
    vocab_size=97,
    d_model=16,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    mlp_dim=24,
    num_experts=4,
    experts_per_token=2,
    init_std=0.3,
)


def dense_reference(moe, x):
    """Every token through each of its top-k experts, one at a time (no grouping)."""
    xf = np.asarray(x.reshape(-1, x.shape[-1]), np.float64)
    logits = xf @ np.asarray(moe.router.kernel[...], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    g, u, d = (np.asarray(p[...], np.float64) for p in (moe.gate_proj, moe.up_proj, moe.down_proj))
    out = np.zeros_like(xf)
    for n in range(xf.shape[0]):
        top = np.argsort(-probs[n])[:2]
        w = probs[n, top] / probs[n, top].sum()
        for e, we in zip(top, w, strict=True):
            h = xf[n] @ g[e]
            out[n] += we * (((h / (1 + np.exp(-h))) * (xf[n] @ u[e])) @ d[e])
    return out.reshape(x.shape)


def test_dropless_moe_matches_per_token_reference_and_has_grads():
    moe = nnlib.MoE(CFG, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 7, 16))
    seg = jnp.ones((2, 7), jnp.int32)
    graphdef, state = nnx.split(moe)
    run = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x, seg))
    y, aux = run(state, x)
    assert max_diff(y, dense_reference(moe, x)) < 1e-4
    assert float(aux["moe_load_balance_loss"]) >= 1.0 - 1e-4  # >= k*... minimum is 1 * k / k
    grads = jax.jit(jax.grad(lambda s: run(s, x)[0].sum() + run(s, x)[1]["moe_load_balance_loss"]))(
        state
    )
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))
    assert float(jnp.abs(grads["router"]["kernel"][...]).max()) > 0


def test_dense_impl_computes_the_same_function():
    ragged = nnlib.MoE(CFG, rngs=nnx.Rngs(0))
    dense = nnlib.MoE(CFG.replace(moe_impl="dense"), rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (2, 5, 16))
    seg = jnp.ones((2, 5), jnp.int32)
    (y1, a1), (y2, a2) = (jax.jit(lambda x, m=m: m(x, seg))(x) for m in (ragged, dense))
    assert max_diff(y1, y2) < 1e-5
    assert max_diff(a1["moe_load_balance_loss"], a2["moe_load_balance_loss"]) == 0.0


def test_aux_losses_ignore_padding_and_reach_the_model_output():
    moe = nnlib.MoE(CFG, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(moe)
    run = jax.jit(lambda x, seg: nnx.merge(graphdef, state)(x, seg))
    x = jax.random.normal(jax.random.key(1), (1, 6, 16))
    junk = x.at[:, 3:].set(50.0)
    _, aux_real = run(x, jnp.array([[1, 1, 1, 0, 0, 0]], jnp.int32))
    _, aux_pad = run(junk, jnp.array([[1, 1, 1, 0, 0, 0]], jnp.int32))
    for k in aux_real:
        assert abs(float(aux_real[k]) - float(aux_pad[k])) < 1e-5
    model = nnlib.Transformer(CFG, rngs=nnx.Rngs(0))
    apply, params = nnlib.as_function(model)
    tokens = jnp.ones((1, 5), jnp.int32)
    _, _, aux = jax.jit(lambda p: apply(p, tokens, jnp.arange(5)[None], return_aux=True))(params)
    assert set(aux) == {"moe_load_balance_loss", "moe_router_z_loss"}
    assert float(aux["moe_router_z_loss"]) > 0
