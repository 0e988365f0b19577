"""Leaf paths follow the project's convention: keystr(simple, "/") minus a final NNX `value`."""

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxstack.optlib import param_paths


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Boxed:
    raw_value: jax.Array


class Block(nnx.Module):
    def __init__(self):
        self.layers = nnx.List([nnx.Linear(2, 2, rngs=nnx.Rngs(0))])


def test_nnx_variables_lose_their_value_attribute_and_nothing_else():
    state = nnx.state(Block(), nnx.Param)
    assert sorted(jax.tree.leaves(param_paths(state))) == ["layers/0/bias", "layers/0/kernel"]
    # An Optax state over it: NamedTuple fields and indices joined the same way.
    opt_paths = jax.tree.leaves(param_paths(optax.adam(1e-3).init(state)))
    assert "0/mu/layers/0/kernel" in opt_paths and "0/count" in opt_paths
    # Only the NNX Variable's final GetAttrKey("value") goes; other names are real names.
    tree = {"gate": {"value": jnp.ones(1)}, "w": Boxed(jnp.ones(1))}
    assert jax.tree.leaves(param_paths(tree)) == ["gate/value", "w/raw_value"]
