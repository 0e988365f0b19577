"""Shared helpers of jaxstack-ckptlib's tests (imported by name via conftest's sys.path entry)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax


def make_state(seed: int = 0, *, d: int = 16) -> dict:
    """A small training state: params, an AdamW opt_state (optax NamedTuples), a step."""
    rng = np.random.default_rng(seed)
    params = {
        "embed": jnp.asarray(rng.standard_normal((32, d), dtype=np.float32)),
        "layers": [
            {"kernel": jnp.asarray(rng.standard_normal((d, d), dtype=np.float32))} for _ in range(2)
        ],
        "norm": {"scale": jnp.asarray(rng.standard_normal(d), dtype=jnp.bfloat16)},
    }
    opt_state = optax.adamw(1e-3).init(params)
    opt_state = jax.tree.map(lambda x: x + 1 if x.dtype != jnp.int32 else x + seed, opt_state)
    return {"params": params, "opt_state": opt_state, "step": seed}


def assert_trees_equal(a, b) -> None:
    """Same structure, same leaf types, bitwise-equal values."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if isinstance(x, int | float | bool):
            assert type(x) is type(y) and x == y
            continue
        assert np.dtype(x.dtype) == np.dtype(y.dtype)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
