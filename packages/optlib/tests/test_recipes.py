"""Behaviour of the recipe features: masks, frozen paths, accumulation, lr readout, EMA, skip."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax import contrib
from optlib_testing import grads_at, run_updates

from jaxstack.optlib import (
    Error,
    OptimizerConfig,
    build_optimizer,
    current_learning_rate,
    ema_params,
    nonfinite_count,
    param_paths,
)


def state_bytes(state) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))


def param_bytes(params) -> int:
    return state_bytes(params)


def decayed_paths(config, params):
    """Paths whose update under zero gradients is nonzero, i.e. those weight decay acts on."""
    tx = build_optimizer(config, params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    flags = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
    return {
        p
        for p, f in zip(jax.tree.leaves(param_paths(params)), jax.tree.leaves(flags), strict=True)
        if f
    }


def test_default_mask_spares_norms_biases_and_embeddings(params):
    got = decayed_paths(OptimizerConfig(weight_decay=0.1), params)
    assert got == {
        f"layers/{i}/{p}"
        for i in "01"
        for p in ("attn/q_proj/kernel", "attn/o_proj/kernel", "mlp/up_proj/kernel")
    } | {"lm_head/kernel"}
    # An explicit list replaces the default; an empty list decays everything.
    got = decayed_paths(OptimizerConfig(weight_decay=0.1, weight_decay_mask=["kernel$"]), params)
    assert got == {"embed/embedding", "final_norm/scale"} | {
        f"layers/{i}/{p}" for i in "01" for p in ("mlp/up_proj/bias", "input_norm/scale")
    }
    all_paths = set(jax.tree.leaves(param_paths(params)))
    assert decayed_paths(OptimizerConfig(weight_decay=0.1, weight_decay_mask=[]), params) == (
        all_paths
    )


def test_nnx_state_paths_and_masks():
    nnx = pytest.importorskip("flax.nnx")

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(16, 8, rngs=rngs)
            self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(2)])
            self.final_norm = nnx.RMSNorm(8, rngs=rngs)

    _, state = nnx.split(Block(nnx.Rngs(0)), nnx.Param)
    assert sorted(jax.tree.leaves(param_paths(state))) == [
        "embed/embedding",
        "final_norm/scale",
        "layers/0/bias",
        "layers/0/kernel",
        "layers/1/bias",
        "layers/1/kernel",
    ]
    config = OptimizerConfig(weight_decay=0.1, frozen=["^layers/1/"])
    assert decayed_paths(config, state) == {"layers/0/kernel"}
    tx = build_optimizer(config, state)
    updates, _ = jax.jit(tx.update)(grads_at(state, 0), tx.init(state), state)
    assert type(updates) is type(state)
    new = optax.apply_updates(state, updates)
    np.testing.assert_array_equal(
        new["layers"][1]["kernel"][...], state["layers"][1]["kernel"][...]
    )
    assert not np.array_equal(new["layers"][0]["kernel"][...], state["layers"][0]["kernel"][...])


def test_frozen_paths_get_zero_updates_and_no_state(params):
    frozen = OptimizerConfig(frozen=["^layers/"])
    history, state, final = run_updates(build_optimizer(frozen, params), params, steps=3)
    for update in history:
        assert all(not jnp.any(u) for u in jax.tree.leaves(update["layers"]))
    for path, before, after in zip(
        jax.tree.leaves(param_paths(params)),
        jax.tree.leaves(params),
        jax.tree.leaves(final),
        strict=True,
    ):
        assert np.array_equal(before, after) == path.startswith("layers/"), path
    trainable = {k: v for k, v in params.items() if k != "layers"}
    # Adam keeps mu and nu only for the trainable leaves.
    adam_state = build_optimizer(OptimizerConfig(), trainable).init(trainable)
    assert state_bytes(state) == state_bytes(adam_state)


def test_accumulation_adds_no_buffer_at_k1_and_one_param_copy_at_k4(params):
    plain = state_bytes(optax.adamw(1e-3).init(params))
    k1 = build_optimizer(OptimizerConfig(accumulate_steps=1), params).init(params)
    assert plain <= state_bytes(k1) < plain + 64  # only inject_hyperparams' scalars
    assert not any(
        isinstance(s, optax.MultiStepsState)
        for s in jax.tree.leaves(k1, is_leaf=lambda x: isinstance(x, optax.MultiStepsState))
    )
    k4 = build_optimizer(OptimizerConfig(accumulate_steps=4), params).init(params)
    extra = state_bytes(k4) - state_bytes(k1)
    assert param_bytes(params) <= extra < param_bytes(params) + 64  # acc_grads + counters


def test_accumulation_averages_and_steps_every_k(params):
    config = OptimizerConfig(name="sgd", learning_rate=0.5, accumulate_steps=3)
    history, _, final = run_updates(build_optimizer(config, params), params, steps=6)
    for step, update in enumerate(history):
        assert any(jnp.any(u) for u in jax.tree.leaves(update)) == (step % 3 == 2)
    mean_grads = [
        jax.tree.map(lambda *g: sum(g) / 3, *[grads_at(params, s) for s in r])
        for r in (range(3), range(3, 6))
    ]
    expected = jax.tree.map(lambda p, g0, g1: p - 0.5 * g0 - 0.5 * g1, params, *mean_grads)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), final, expected
    )


def test_current_learning_rate_follows_the_schedule_in_optimizer_steps(params):
    config = OptimizerConfig(
        learning_rate=1.0, accumulate_steps=2, schedule={"name": "constant", "warmup_steps": 4}
    )
    tx = build_optimizer(config, params)
    state, update = tx.init(params), jax.jit(tx.update)
    assert float(current_learning_rate(state)) == 0.0
    seen = []
    for step in range(8):
        _, state = update(grads_at(params, step), state, params)
        seen.append(float(current_learning_rate(state)))
    # inject_hyperparams records the lr it used; it advances once per 2 micro-batches.
    assert seen == [0.0, 0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75]
    assert current_learning_rate(optax.adam(1e-3).init(params)) is None


def test_ema_of_params_matches_a_hand_computed_average(params):
    config = OptimizerConfig(name="sgd", learning_rate=0.1, ema_decay=0.8, frozen=["^embed/"])
    tx = build_optimizer(config, params)
    state, p, update = tx.init(params), params, jax.jit(tx.update)
    ema = jax.tree.map(np.asarray, params)
    for step in range(5):
        updates, state = update(grads_at(p, step), state, p)
        p = optax.apply_updates(p, updates)
        ema = jax.tree.map(lambda e, x: 0.8 * e + 0.2 * np.asarray(x), ema, p)
    got = ema_params(state, p)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, ema)
    np.testing.assert_array_equal(got["embed"]["embedding"], params["embed"]["embedding"])
    with pytest.raises(Error, match="set ema_decay"):
        ema_params(build_optimizer(OptimizerConfig(), params).init(params))


def test_nonfinite_gradients_are_skipped_and_counted(params):
    config = OptimizerConfig(
        skip_nonfinite=True,
        max_consecutive_nonfinite=2,
        schedule={"name": "constant", "warmup_steps": 10},
    )
    tx = build_optimizer(config, params)
    state, update = tx.init(params), jax.jit(tx.update)
    bad = jax.tree.map(lambda g: g.at[(0,) * g.ndim].set(jnp.inf), grads_at(params, 0))
    _, state = update(grads_at(params, 0), state, params)
    lr = float(current_learning_rate(state))
    for expected in (1, 2):
        updates, state = update(bad, state, params)
        assert all(not jnp.any(u) for u in jax.tree.leaves(updates))
        assert int(nonfinite_count(state)) == expected
        assert float(current_learning_rate(state)) == lr  # the schedule did not advance
    updates, state = update(bad, state, params)  # the third in a row goes through
    assert not all(bool(jnp.isfinite(u).all()) for u in jax.tree.leaves(updates))
    assert nonfinite_count(build_optimizer(OptimizerConfig(), params).init(params)) is None


def muon_paths(state):
    """Paths of the leaves contrib.muon's own momentum covers."""
    found = [
        n
        for n in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, contrib.MuonState))
        if isinstance(n, contrib.MuonState)
    ]
    return set(jax.tree.leaves(param_paths(found[0].mu)))


def test_muon_sends_embeddings_head_and_non_matrices_to_adam(params):
    state = build_optimizer(OptimizerConfig(name="muon"), params).init(params)
    assert muon_paths(state) == {
        f"layers/{i}/{p}" for i in "01" for p in ("attn/o_proj/kernel", "mlp/up_proj/kernel")
    }
    config = OptimizerConfig(
        name="muon",
        muon_exclude=[],
        muon_dimension_numbers={"q_proj/kernel$": [[0], [1, 2]], "o_proj": None},
    )
    state = build_optimizer(config, params).init(params)
    assert muon_paths(state) == {"embed/embedding", "lm_head/kernel"} | {
        f"layers/{i}/{p}" for i in "01" for p in ("attn/q_proj/kernel", "mlp/up_proj/kernel")
    }
    history, _, _ = run_updates(build_optimizer(config, params), params, steps=2)
    assert all(bool(jnp.isfinite(u).all()) for u in jax.tree.leaves(history[-1]))


def test_muon_fallback_keeps_the_decay_mask(params):
    # q_proj (3-D, so Adam fallback) is decayed; the norms on the fallback are not.
    got = decayed_paths(OptimizerConfig(name="muon", weight_decay=0.1), params)
    assert {"layers/0/attn/q_proj/kernel", "lm_head/kernel"} <= got
    assert not any("norm" in p or "bias" in p or "embed" in p for p in got)


@pytest.mark.parametrize("name", ["adamw", "lion", "muon", "schedule_free_adamw"])
def test_bfloat16_params_and_abstract_init(params, name):
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    tx = build_optimizer(OptimizerConfig(name=name, learning_rate=1e-2, weight_decay=0.1), params)
    abstract = jax.eval_shape(
        tx.init, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    )
    assert jax.tree.structure(abstract) == jax.tree.structure(tx.init(params))
    _, _, final = run_updates(tx, params, steps=2)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(final))
    assert not np.array_equal(
        np.asarray(final["lm_head"]["kernel"], np.float32),
        np.asarray(params["lm_head"]["kernel"], np.float32),
    )


def test_recipe_inside_nnx_optimizer():
    nnx = pytest.importorskip("flax.nnx")

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(16, 8, rngs=rngs)
            self.lin = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, x):
            return self.lin(self.embed(x))

    model = Model(nnx.Rngs(0))
    config = OptimizerConfig(
        name="sgd", learning_rate=0.1, ema_decay=0.5, frozen=["^embed/"], skip_nonfinite=True
    )
    optimizer = nnx.Optimizer(
        model, build_optimizer(config, nnx.state(model, nnx.Param)), wrt=nnx.Param
    )

    @nnx.jit
    def step(model, optimizer, x):
        optimizer.update(model, nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model))

    kernels = [np.asarray(model.lin.kernel[...])]
    embedding = np.asarray(model.embed.embedding[...])
    for _ in range(2):
        step(model, optimizer, jnp.arange(4))
        kernels.append(np.asarray(model.lin.kernel[...]))
    assert float(current_learning_rate(optimizer.opt_state)) == pytest.approx(0.1)
    assert int(nonfinite_count(optimizer.opt_state)) == 0
    ema = ema_params(optimizer.opt_state, nnx.state(model, nnx.Param))
    assert type(ema) is type(nnx.state(model, nnx.Param))
    expected = 0.5 * (0.5 * kernels[0] + 0.5 * kernels[1]) + 0.5 * kernels[2]
    np.testing.assert_allclose(ema["lin"]["kernel"][...], expected, rtol=1e-6)
    np.testing.assert_array_equal(ema["embed"]["embedding"][...], embedding)
    np.testing.assert_array_equal(model.embed.embedding[...], embedding)
