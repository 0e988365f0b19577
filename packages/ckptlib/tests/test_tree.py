import json
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import optax

from jaxstack.ckptlib._src.tree import describe, flatten, nest, rebuild


class Pair(NamedTuple):
    first: object
    second: object


def test_describe_rebuild_roundtrips_containers_through_json():
    tree = {
        "a": [jnp.ones(2), (np.zeros(3), None)],
        "p": Pair(first={}, second={3: jnp.ones(1)}),
        "opt": optax.adam(1e-3).init({"w": jnp.ones(2)}),
    }
    paths, leaves, _ = flatten(tree)
    assert ("p", "second", "3") in paths and ("opt", "0", "mu", "w") in paths
    desc = json.loads(json.dumps(describe(tree)))
    back = rebuild(desc, dict(zip(paths, leaves, strict=True)))
    assert back.keys() == tree.keys()
    assert isinstance(back["p"], Pair) and back["p"].first == {}
    assert list(back["p"].second) == [3]  # int keys stay ints
    assert isinstance(back["a"][1], tuple) and back["a"][1][1] is None
    assert type(back["opt"][0]).__name__ == "ScaleByAdamState"
    assert type(back["opt"][1]) is optax.EmptyState


def test_nest_builds_dicts_from_paths():
    paths = [("a", "b"), ("a", "c"), ("d",)]
    assert nest(paths, [1, 2, 3]) == {"a": {"b": 1, "c": 2}, "d": 3}
