"""The `/`-joined parameter path convention (`layers/3/attn/q_proj/kernel`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
from flax import nnx


def key_str(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def join_path(path: tuple[Any, ...]) -> str:
    """'/'-joined path of a tree_flatten_with_path key path, without the trailing `.value`."""
    parts = [
        key_str(k)
        for k in path
        if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value")
    ]
    return "/".join(parts)


def iter_variables(tree: Any) -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of a State/dict, stopping at nnx.Variables."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)[0]:
        yield join_path(path), leaf


def flat_arrays(tree: Any) -> dict[str, Any]:
    """{path: array} for a params State or nested dict."""
    return {p: (leaf[...] if is_variable(leaf) else leaf) for p, leaf in iter_variables(tree)}
