"""Leaf paths as strings, by the project's convention (one implementation in this package).

A leaf's path is `jax.tree_util.keystr(key_path, simple=True, separator="/")` after dropping a
final `GetAttrKey("value")` (the Flax NNX Variable wrapper; a dict key named "value" is a real
name and stays): nnlib state gives `layers/3/attn/q_proj/kernel`, an Optax state
`0/mu/layers/3/attn/q_proj/kernel`. Checkpoints match leaves by the tuple of key names
(`key_names`), which keeps the Variable's `value` because Orbax stores it as a level of its tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

_VARIABLE_VALUE = jax.tree_util.GetAttrKey("value")


def path_str(key_path: Sequence[Any]) -> str:
    """`layers/3/attn/q_proj/kernel` for a key path from `jax.tree_util.tree_flatten_with_path`."""
    keys = tuple(key_path)
    if keys and keys[-1] == _VARIABLE_VALUE:
        keys = keys[:-1]
    return jax.tree_util.keystr(keys, simple=True, separator="/")


def key_names(key_path: Sequence[Any]) -> tuple[str, ...]:
    """Each key of a key path as its name (dict key, index, attribute), e.g. ("layers", "3")."""
    return tuple(jax.tree_util.keystr((k,), simple=True) for k in key_path)
