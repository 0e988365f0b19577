"""The parameter path convention: keystr(simple, "/") without a final Variable `.value`."""

import collections

import jax
import numpy as np
import optax
from flax import nnx
from nnlib_testutil import make

from jaxstack import nnlib


def paths(tree, **kw):
    return [nnlib.param_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree, **kw)[0]]


def test_nnx_state_paths_drop_only_the_variable_wrapper():
    params = nnx.state(make(), nnx.Param)
    got = paths(params)
    assert "layers/0/attn/q_proj/kernel" in got and "embed" in got
    assert not any(p.endswith("/value") for p in got)
    # The same names whether the walk stops at the Variables or goes into them.
    assert paths(params, is_leaf=lambda x: isinstance(x, nnx.Variable)) == got


def test_optax_state_and_dict_paths():
    params = nnx.state(make(), nnx.Param)
    adam = paths(optax.adam(1e-3).init(params))
    assert "0/mu/layers/0/attn/q_proj/kernel" in adam and "0/count" in adam
    # A dict key named "value" is a real name; a `.value` attribute inside the path stays too.
    Box = collections.namedtuple("Box", ["value"])
    tree = {"value": np.zeros(1), "box": Box({"w": np.zeros(1)}), "list": [np.zeros(1)]}
    assert paths(tree) == ["box/value/w", "list/0", "value"]
