"""The train step itself: accumulation equals the full batch, bf16 compute, MoE aux losses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstack import nnlib, optlib
from jaxstack.trainer import load_config, make_loss_fn, make_train_step, train

CFG = nnlib.get_preset("tiny").replace(
    d_model=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    head_dim=16,
    mlp_dim=64,
    vocab_size=64,
    max_seq_len=16,
)


def _batch(b=8, t=16, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 64, (b, t), dtype=np.int32)
    segments = np.ones((b, t), np.int32)
    segments[:, t // 2 :] = 2  # two packed documents per row
    segments[0, -3:] = 0  # some padding
    positions = np.concatenate([np.arange(t // 2), np.arange(t - t // 2)]).astype(np.int32)
    return {
        "tokens": jnp.asarray(tokens),
        "targets": jnp.asarray(np.roll(tokens, -1, axis=1)),
        "segment_ids": jnp.asarray(segments),
        "positions": jnp.asarray(np.broadcast_to(positions, (b, t))),
        "loss_mask": jnp.asarray((segments > 0).astype(np.float32)),
    }


def _state(config=CFG, optimizer="adamw"):
    apply, params = nnlib.as_function(nnlib.Transformer(config, rngs=nnx.Rngs(0)))
    tx = optlib.build_optimizer(optlib.OptimizerConfig(name=optimizer, learning_rate=1.0), params)
    return apply, tx, {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}


def test_grad_accumulation_equals_the_full_batch():
    # SGD with lr 1: the parameter change is the gradient itself (Adam would amplify rounding)
    apply, tx, state = _state(optimizer="sgd")
    loss_fn = make_loss_fn(apply)
    batch = _batch()
    full = jax.jit(make_train_step(loss_fn, tx, grad_accum=1))
    accum = jax.jit(make_train_step(loss_fn, tx, grad_accum=4))
    s1, m1 = full(state, batch)
    s4, m4 = accum(state, batch)
    assert float(m4["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-5)
    assert float(m4["grad_norm"]) == pytest.approx(float(m1["grad_norm"]), rel=1e-4)
    assert float(m4["num_tokens"]) == float(m1["num_tokens"]) == 8 * 16 - 3
    for a, b in zip(jax.tree.leaves(s1["params"]), jax.tree.leaves(s4["params"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert int(s4["step"]) == 1


def test_z_loss_is_added():
    apply, tx, state = _state()
    batch = _batch()
    _, plain = jax.jit(make_train_step(make_loss_fn(apply), tx))(state, batch)
    _, z = jax.jit(make_train_step(make_loss_fn(apply, z_loss_weight=1.0), tx))(state, batch)
    assert float(z["z_loss"]) > 0
    assert float(z["loss"]) == pytest.approx(float(plain["loss"]) + float(z["z_loss"]), rel=1e-5)


def test_moe_aux_losses_reach_the_loss_and_metrics():
    moe = CFG.replace(family="mixtral", num_experts=4, experts_per_token=2, mlp_dim=32)
    apply, tx, state = _state(moe)
    batch = _batch()
    weights = {"moe_load_balance_loss": 0.5, "moe_router_z_loss": 0.25}
    _, m = jax.jit(make_train_step(make_loss_fn(apply, aux_weights=weights), tx))(state, batch)
    _, m0 = jax.jit(make_train_step(make_loss_fn(apply), tx))(state, batch)
    lb, rz = float(m["moe_load_balance_loss"]), float(m["moe_router_z_loss"])
    assert lb > 0 and rz > 0
    assert float(m["loss"]) == pytest.approx(float(m0["loss"]) + 0.5 * lb + 0.25 * rz, rel=1e-5)


def test_bf16_compute_keeps_f32_master_params(tmp_path):
    config = load_config(
        "test",
        [
            f"log.run_dir={tmp_path}",
            "model.dtype=bfloat16",
            "train.steps=12",
            "checkpoint.enabled=false",
            "log.sample_tokens=0",
            "optim.lr=1e-2",
        ],
    )
    result = train(config)
    assert {x.dtype for x in jax.tree.leaves(result.state["params"])} == {jnp.dtype("float32")}
    assert result.summary["final_loss"] < result.summary["first_loss"] - 0.5
