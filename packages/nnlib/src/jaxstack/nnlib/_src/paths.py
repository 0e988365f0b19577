"""The project's parameter path convention (`layers/3/attn/q_proj/kernel`).

A path is JAX's own `keystr(key_path, simple=True, separator="/")` after dropping a final
`.value` attribute (the Flax NNX Variable wrapper; a dict key named "value" is a real name and
stays). Every package that names parameters by path writes exactly this.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import jax
from flax import nnx


def param_path(key_path: Sequence[Any]) -> str:
    """The `/`-joined path of a PyTree key path, e.g. from `jax.tree_util.tree_flatten_with_path`.

    Example:
      >>> state = nnx.state(model, nnx.Param)  # doctest: +SKIP
      >>> [param_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]][0]
      'embed'
    """
    key_path = tuple(key_path)
    last = key_path[-1] if key_path else None
    if isinstance(last, jax.tree_util.GetAttrKey) and last.name == "value":
        key_path = key_path[:-1]
    return jax.tree_util.keystr(key_path, simple=True, separator="/")


def is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def iter_variables(tree: Any) -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of a State/dict, stopping at nnx.Variables."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)[0]:
        yield param_path(path), leaf


def flat_arrays(tree: Any) -> dict[str, Any]:
    """{path: array} for a params State or nested dict."""
    return {p: (leaf[...] if is_variable(leaf) else leaf) for p, leaf in iter_variables(tree)}
