"""Flax NNX states (what nnlib and the trainer hand over) through save, restore and safetensors."""

import jax
import numpy as np
import optax
from ckptlib_testutil import assert_trees_equal
from flax import nnx

from jaxstack.ckptlib import CheckpointManager, load_safetensors, save_safetensors


class Tiny(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])
        self.head = nnx.Linear(4, 3, rngs=rngs)


def test_nnx_state_with_optax_state_roundtrips_into_the_model(tmp_path):
    model = Tiny(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    state = {"params": params, "opt_state": optax.adamw(1e-3).init(params), "step": 5}
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, state
    )
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(5, state)
        restored = mgr.restore(target=target).state
    assert type(restored["params"]) is nnx.State
    assert_trees_equal(restored, state)
    fresh = Tiny(nnx.Rngs(1))
    nnx.update(fresh, restored["params"])
    np.testing.assert_array_equal(fresh.head.kernel[...], model.head.kernel[...])


def test_nnx_state_to_safetensors_uses_plain_paths(tmp_path):
    model = Tiny(nnx.Rngs(0))
    names = save_safetensors(nnx.state(model, nnx.Param), tmp_path / "m.safetensors")
    assert "layers/1/kernel" in names and "head/bias" in names
    back = load_safetensors(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(back["layers"]["1"]["kernel"], model.layers[1].kernel[...])
