"""Logical axis names per parameter and their PartitionSpecs under logical->mesh rules.

Every nnx.Param carries `logical_axes` metadata when it is created. Stacked (scanned) layers
have one more array dimension than their names: that leading dimension is the "layers" axis,
so a rule like {"layers": "fsdp"} really shards the stack over its layer axis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx
from jax.sharding import PartitionSpec

from jaxstack.nnlib._src.errors import Error
from jaxstack.nnlib._src.paths import is_variable, param_path


def _axes_of(path: str, var: nnx.Variable) -> tuple[str | None, ...]:
    meta = var.get_metadata()
    axes = tuple(meta.get("logical_axes") or ())
    # get_value(), not var[...]: under nnx.eval_shape the value is a ShapeDtypeStruct.
    shape = var.get_value().shape
    if len(axes) == len(shape) - 1:
        axes = ("layers", *axes)
    if len(axes) != len(shape):
        raise Error(
            f"param {path!r} has shape {shape} but logical_axes {axes}; "
            "create it with nnx.Param(value, logical_axes=(...)) naming every axis"
        )
    return axes


def logical_axes(model_or_state: Any) -> Any:
    """Logical axis-name tuples, one per nnx.Param, in the tree of `nnx.state(model, nnx.Param)`."""
    state = model_or_state
    if isinstance(model_or_state, nnx.Module):
        state = nnx.state(model_or_state, nnx.Param)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_variable)
    out = []
    for path, var in leaves:
        if not is_variable(var):
            raise Error(
                f"logical_axes needs the nnx.State of the model (Variables with metadata); "
                f"got a plain leaf at {param_path(path)!r}"
            )
        out.append(_axes_of(param_path(path), var))
    return jax.tree_util.tree_unflatten(treedef, out)


def spec_for(axes: tuple[str | None, ...], rules: Mapping[str, Any]) -> PartitionSpec:
    """PartitionSpec for one leaf; a mesh axis is used at most once per spec (first wins)."""
    used: set[str] = set()
    entries = []
    for name in axes:
        target = rules.get(name) if name is not None else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n not in used)
        used.update(names)
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*entries)


def partition_specs(params: Any, rules: Mapping[str, str | tuple[str, ...] | None]) -> Any:
    """PartitionSpec per param (same tree as `params`, specs at the Variable positions).

    Usable as a tree prefix for jax.device_put / jit shardings:
      specs = partition_specs(params, {"embed": "fsdp", "mlp": "tensor", "heads": "tensor"})
      shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    Logical names missing from `rules` are replicated.
    """
    axes = logical_axes(params)
    return jax.tree.map(lambda a: spec_for(a, rules), axes, is_leaf=lambda x: isinstance(x, tuple))
