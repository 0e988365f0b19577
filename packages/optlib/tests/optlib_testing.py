"""Test helpers of optlib (a unique module name: the workspace runs all tests together)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax


def make_params(seed: int = 0) -> dict:
    keys = iter(jax.random.split(jax.random.key(seed), 16))

    def normal(*shape):
        return jax.random.normal(next(keys), shape, jnp.float32)

    layer = lambda: {
        "attn": {"q_proj": {"kernel": normal(8, 2, 4)}, "o_proj": {"kernel": normal(8, 8)}},
        "mlp": {"up_proj": {"kernel": normal(8, 16), "bias": normal(16)}},
        "input_norm": {"scale": 1.0 + normal(8)},
    }
    return {
        "embed": {"embedding": normal(12, 8)},
        "layers": {"0": layer(), "1": layer()},
        "final_norm": {"scale": 1.0 + normal(8)},
        "lm_head": {"kernel": normal(8, 12)},
    }


def grads_at(params, step: int, scale: float = 1.0):
    """Deterministic pseudo-gradients for one step."""
    return _grads_at(params, step, scale)


@jax.jit
def _grads_at(params, step, scale):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(42), step), len(leaves))
    return jax.tree.unflatten(
        treedef,
        [scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)],
    )


def run_updates(tx, params, steps=20, grads_fn=grads_at):
    """Applies `tx` for `steps` steps; returns (per-step updates, final state, final params)."""
    state = tx.init(params)
    update = jax.jit(tx.update)
    history = []
    for step in range(steps):
        updates, state = update(grads_fn(params, step), state, params)
        history.append(updates)
        params = optax.apply_updates(params, updates)
    return history, state, params


def assert_trees_equal(a, b):
    """Bit-for-bit equality of two PyTrees of arrays (same structure)."""
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
