"""Each recipe's updates equal a hand-written Optax chain's, bit for bit, over 20 steps.

The references use Optax's public aliases with the schedule passed as a plain callable and the
masks written out as literal trees, so the tests pin down both the composition and that
`inject_hyperparams` (there only to expose the learning rate) changes no bit.
"""

import jax
import jax.numpy as jnp
import optax
import pytest
from optax import contrib
from optlib_testing import assert_trees_equal, grads_at, run_updates

from jaxstack.optlib import (
    OptimizerConfig,
    build_optimizer,
    current_learning_rate,
    nonfinite_count,
    schedule_free_eval_params,
)


def literal_mask(params, decayed):
    """True for the leaves whose path (joined by '/') is in `decayed`."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: "/".join(k.key for k in kp) in decayed, params
    )


# The default no-decay rule leaves exactly these decayed in the fixture tree.
DEFAULT_DECAYED = {
    f"layers/{i}/{p}"
    for i in "01"
    for p in ("attn/q_proj/kernel", "attn/o_proj/kernel", "mlp/up_proj/kernel")
} | {"lm_head/kernel"}


def assert_parity(config, reference, params, steps=20, grads_fn=grads_at):
    ours, our_state, _ = run_updates(build_optimizer(config, params), params, steps, grads_fn)
    theirs, their_state, _ = run_updates(reference, params, steps, grads_fn)
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        try:
            assert_trees_equal(a, b)
        except AssertionError as error:
            raise AssertionError(f"updates differ at step {step}") from error
    for update in ours:
        assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(update))
    return our_state, their_state


def test_adamw_warmup_cosine_clip(params):
    config = OptimizerConfig.from_dict(
        {
            "name": "adamw",
            "learning_rate": 1e-2,
            "weight_decay": 0.1,
            "clip_norm": 1.0,
            "b2": 0.95,
            "schedule": {
                "name": "warmup_cosine",
                "warmup_steps": 5,
                "total_steps": 20,
                "final_lr_ratio": 0.1,
            },
        }
    )
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 20, 1e-2 * 0.1)
    reference = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(
            schedule, b2=0.95, weight_decay=0.1, mask=literal_mask(params, DEFAULT_DECAYED)
        ),
    )
    ours, _ = assert_parity(config, reference, params)
    assert float(current_learning_rate(ours)) == pytest.approx(float(schedule(19)))


def test_adam_l2_warmup_linear(params):
    config = OptimizerConfig(
        name="adam",
        learning_rate=3e-3,
        weight_decay=0.01,
        schedule={"name": "warmup_linear", "warmup_steps": 3, "total_steps": 20},
    )
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, 3e-3, 3), optax.linear_schedule(3e-3, 0.0, 17)], [3]
    )
    reference = optax.chain(
        optax.add_decayed_weights(0.01, literal_mask(params, DEFAULT_DECAYED)),
        optax.adam(schedule),
    )
    assert_parity(config, reference, params)


def test_lion_wsd(params):
    config = OptimizerConfig(
        name="lion",
        learning_rate=1e-3,
        b1=0.95,
        b2=0.98,
        weight_decay=0.1,
        schedule={
            "name": "wsd",
            "warmup_steps": 2,
            "total_steps": 20,
            "decay_steps": 5,
            "final_lr_ratio": 0.0,
        },
    )
    schedule = optax.join_schedules(
        [
            optax.linear_schedule(0.0, 1e-3, 2),
            optax.constant_schedule(1e-3),
            optax.linear_schedule(1e-3, 0.0, 5),
        ],
        [2, 15],
    )
    reference = optax.lion(
        schedule, b1=0.95, b2=0.98, weight_decay=0.1, mask=literal_mask(params, DEFAULT_DECAYED)
    )
    assert_parity(config, reference, params)


def test_adafactor_inverse_sqrt(params):
    config = OptimizerConfig(
        name="adafactor",
        learning_rate=1e-2,
        momentum=0.9,
        weight_decay=0.01,
        schedule={"name": "inverse_sqrt", "warmup_steps": 4},
    )

    def schedule(count):  # lr * min(step / 4, sqrt(4 / step)), written out independently
        step = jnp.asarray(count, jnp.float32)
        return jnp.where(
            step < 4, 0.0 + (1e-2 - 0.0) * step / 4, 1e-2 * jnp.sqrt(4 / jnp.maximum(step, 4))
        )

    reference = optax.adafactor(
        schedule,
        momentum=0.9,
        weight_decay_rate=0.01,
        weight_decay_mask=literal_mask(params, DEFAULT_DECAYED),
    )
    assert_parity(config, reference, params)


def test_sgd_nesterov_constant_with_warmup(params):
    config = OptimizerConfig(
        name="sgd",
        learning_rate=0.1,
        momentum=0.9,
        nesterov=True,
        schedule={"name": "constant", "warmup_steps": 3},
    )
    reference = optax.sgd(optax.warmup_constant_schedule(0.0, 0.1, 3), momentum=0.9, nesterov=True)
    assert_parity(config, reference, params)


def test_muon_matches_contrib_muon(params):
    # The weight-decay mask spares every Adam-fallback leaf, so contrib.muon's unmasked
    # fallback (adam_weight_decay=0) is the exact reference.
    muon_leaves = {
        f"layers/{i}/{p}" for i in "01" for p in ("attn/o_proj/kernel", "mlp/up_proj/kernel")
    }
    config = OptimizerConfig(
        name="muon",
        learning_rate=0.02,
        weight_decay=0.1,
        weight_decay_mask=["embed", "q_proj", "bias", "norm", "lm_head"],
    )
    dims = jax.tree_util.tree_map_with_path(
        lambda kp, _: (
            contrib.MuonDimensionNumbers() if "/".join(k.key for k in kp) in muon_leaves else None
        ),
        params,
    )
    reference = contrib.muon(
        0.02,
        weight_decay=0.1,
        weight_decay_mask=literal_mask(params, muon_leaves),
        muon_weight_dimension_numbers=dims,
        adam_weight_decay=0.0,
    )
    assert_parity(config, reference, params)


def test_schedule_free_adamw(params):
    config = OptimizerConfig(
        name="schedule_free_adamw",
        learning_rate=1e-2,
        weight_decay=0.01,
        weight_decay_mask=[],
        schedule={"name": "constant", "warmup_steps": 5},
    )
    reference = contrib.schedule_free_adamw(1e-2, warmup_steps=5, weight_decay=0.01)
    ours, theirs = assert_parity(config, reference, params)
    _, _, final = run_updates(reference, params, 20)
    assert_trees_equal(
        schedule_free_eval_params(ours, final), contrib.schedule_free_eval_params(theirs, final)
    )


def test_composite_frozen_multipliers_accumulation_skip(params):
    """Frozen embeddings, 2x lr on norms, 4-step accumulation, clipping and NaN skipping."""

    def grads_fn(p, step):
        g = grads_at(p, step)
        if step in (5, 6):  # two poisoned micro-batches inside the second accumulation window
            g["layers"]["0"]["mlp"]["up_proj"]["bias"] = (
                g["layers"]["0"]["mlp"]["up_proj"]["bias"].at[0].set(jnp.nan)
            )
        return g

    config = OptimizerConfig(
        name="adamw",
        learning_rate=1e-2,
        weight_decay=0.1,
        clip_norm=0.5,
        lr_multipliers={"norm": 2.0},
        frozen=["^embed/"],
        accumulate_steps=4,
        skip_nonfinite=True,
        max_consecutive_nonfinite=3,
        schedule={"name": "warmup_cosine", "warmup_steps": 2, "total_steps": 5},
    )
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 5, 0.0)
    norm = lambda p: jax.tree_util.tree_map_with_path(
        lambda kp, _: "fast" if "norm" in "/".join(k.key for k in kp) else "base", p
    )
    mask = literal_mask(params, DEFAULT_DECAYED)
    inner = optax.chain(
        optax.clip_by_global_norm(0.5),
        optax.partition(
            {
                "fast": optax.adamw(lambda c: 2.0 * schedule(c), weight_decay=0.1, mask=mask),
                "base": optax.adamw(schedule, weight_decay=0.1, mask=mask),
            },
            norm,
        ),
    )
    labels = jax.tree_util.tree_map_with_path(
        lambda kp, _: "frozen" if kp[0].key == "embed" else "trainable", params
    )
    reference = optax.partition(
        {
            "trainable": optax.apply_if_finite(
                optax.MultiSteps(inner, 4).gradient_transformation(), 3
            ),
            "frozen": optax.set_to_zero(),
        },
        labels,
    )
    ours, _ = assert_parity(config, reference, params, grads_fn=grads_fn)
    # The two poisoned micro-batches were dropped (not averaged in) and counted.
    assert int(nonfinite_count(ours)) == 2
