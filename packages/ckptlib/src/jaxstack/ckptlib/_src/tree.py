"""PyTree <-> (leaf paths, JSON structure) without pickle.

Leaves are matched by path (`params/layers/3/kernel`: dict keys, list indices, NamedTuple fields
joined by `/`), never by position, so a target's container types need not equal what Orbax wrote
(Orbax stores NamedTuples as dicts and tuples as lists). The container types themselves (dict,
list, tuple, NamedTuple such as optax's `ScaleByAdamState`, None, empty nodes) are recorded as
JSON in the manifest, so a restore without a target still rebuilds the exact structure of plain
trees and of optax states; a restore with a target uses the target's own treedef.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxstack.ckptlib._src import paths
from jaxstack.ckptlib._src.errors import Error

Path = tuple[str, ...]


def path_str(path: Path) -> str:
    return "/".join(path)


def flatten(tree: Any) -> tuple[list[Path], list[Any], Any]:
    """Leaf paths, leaves and treedef; two leaves with the same path are an error."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaf_paths = [paths.key_names(keys) for keys, _ in with_path]
    seen: set[Path] = set()
    for p in leaf_paths:
        if p in seen:
            raise Error(
                f"two leaves share the path {path_str(p)!r} (e.g. dict keys 1 and '1'); "
                "give them distinct keys before saving"
            )
        seen.add(p)
    return leaf_paths, [leaf for _, leaf in with_path], treedef


def nest(paths: list[Path], leaves: list[Any]) -> dict[str, Any]:
    """Nested dict keyed by path components (the layout Orbax writes and plain Orbax reads)."""
    root: dict[str, Any] = {}
    for path, leaf in zip(paths, leaves, strict=True):
        node = root
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = leaf
    return root


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def describe(tree: Any) -> dict[str, Any]:
    """JSON description of the containers of `tree` (leaves become {"t": "leaf"})."""
    if tree is None:
        return {"t": "none"}
    if _is_namedtuple(tree):
        cls = type(tree)
        return {
            "t": "namedtuple",
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "fields": list(cls._fields),
            "children": [describe(c) for c in tree],
        }
    if isinstance(tree, list | tuple) and type(tree) in (list, tuple):
        return {"t": type(tree).__name__, "children": [describe(c) for c in tree]}
    if type(tree) is dict:
        return {
            "t": "dict",
            "keys": [_json_key(k) for k in tree],
            "children": [describe(v) for v in tree.values()],
        }
    children, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    if len(children) == 1 and children[0][0] == ():
        return {"t": "leaf"}
    # Any other registered node (nnx.State, flax structs, ...) is described by its key entries and
    # comes back as a dict unless the caller passes a target of that type.
    cls = type(tree)
    return {
        "t": "dict",
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "keys": [paths.key_names(keys)[0] for keys, _ in children],
        "children": [describe(child) for _, child in children],
    }


def _json_key(k: Any) -> str | int:
    return k if isinstance(k, int | str) and not isinstance(k, bool) else str(k)


def rebuild(description: Mapping[str, Any], flat: Mapping[Path, Any], prefix: Path = ()) -> Any:
    """The tree described by `description`, with leaves taken from `flat` by path."""
    kind = description["t"]
    if kind == "leaf":
        return flat[prefix]
    if kind == "none":
        return None
    if kind in ("list", "tuple"):
        items = [rebuild(c, flat, (*prefix, str(i))) for i, c in enumerate(description["children"])]
        return items if kind == "list" else tuple(items)
    if kind == "namedtuple":
        values = [
            rebuild(c, flat, (*prefix, f))
            for f, c in zip(description["fields"], description["children"], strict=True)
        ]
        cls = _import_namedtuple(description["class"], description["fields"])
        if cls is None:
            return dict(zip(description["fields"], values, strict=True))
        return cls(*values)
    if kind == "dict":
        return {
            k: rebuild(c, flat, (*prefix, str(k)))
            for k, c in zip(description["keys"], description["children"], strict=True)
        }
    raise Error(f"unknown node type {kind!r} in a checkpoint's tree description")


def _import_namedtuple(qualified: str, fields: list[str]) -> type | None:
    """The NamedTuple class named in a manifest, or None if it is gone or changed shape.

    Only NamedTuple classes with exactly the recorded fields are accepted: this rebuilds optax
    states by name without ever executing data from the checkpoint.
    """
    module_name, _, qualname = qualified.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    is_namedtuple = isinstance(obj, type) and issubclass(obj, tuple)
    if is_namedtuple and list(getattr(obj, "_fields", ())) == fields:
        return obj
    return None


def is_prng_key(leaf: Any) -> bool:
    """A typed PRNG key array (`jax.random.key`), stored as its uint32 key data."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def storage_form(leaf: Any) -> Any:
    """What is written for a leaf: typed PRNG keys become their raw uint32 key data."""
    return jax.random.key_data(leaf) if is_prng_key(leaf) else leaf


def leaf_kind(leaf: Any) -> str:
    """How a leaf came in, so a restore without a target gives the same kind back."""
    if is_prng_key(leaf):
        return f"prng_key:{jax.random.key_impl(leaf)}"
    if isinstance(leaf, bool):
        return "bool"
    if isinstance(leaf, int) and not isinstance(leaf, bool):
        return "int"
    if isinstance(leaf, float):
        return "float"
    if isinstance(leaf, np.ndarray | np.generic):
        return "numpy"
    return "jax"


def subdescription(description: Mapping[str, Any], prefix: Path) -> Mapping[str, Any]:
    """The part of a tree description found at `prefix`."""
    node = description
    for part in prefix:
        if node["t"] in ("dict",):
            names = [str(k) for k in node["keys"]]
        elif node["t"] == "namedtuple":
            names = list(node["fields"])
        elif node["t"] in ("list", "tuple"):
            names = [str(i) for i in range(len(node["children"]))]
        else:
            names = []
        if part not in names:
            raise Error(f"the checkpoint's tree has no {part!r} at {path_str(prefix)!r}")
        node = node["children"][names.index(part)]
    return node
