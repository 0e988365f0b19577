"""Device meshes and shardings from config axes and logical-axis rules.

The mesh always has the four named axes `data`, `fsdp`, `tensor`, `expert` (size 1 when
unused), so logical-axis rules never need to know which layout a run picked. Parameters carry
logical axis names (nnlib's `logical_axes`); the rules map each name to mesh axes, and a mesh axis
that does not divide a dimension is dropped for that leaf (replicated) instead of failing, since
small heads or vocabularies often do not split evenly. Optimiser-state leaves take the sharding of
the parameter they mirror (matched by path suffix and shape); the rest (counters) are replicated.
The batch is split on its leading axis over every data-parallel axis (`data`, `fsdp`, `expert`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxstack.trainer._src.config import Config, MeshConfig
from jaxstack.trainer._src.errors import MeshError

AXES = ("data", "fsdp", "tensor", "expert")
BATCH_AXES = ("data", "fsdp", "expert")

DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "seq": None,
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "vocab": "tensor",
    "experts": "expert",
    "layers": None,
}
"""Logical axis -> mesh axis (or axes, or None: replicated) for every logical axis name of the
conventions; a config's `mesh.rules` entries override single names."""


def logical_rules(mesh_config: MeshConfig) -> dict[str, Any]:
    """The default rules with the config's `mesh.rules` entries laid over them."""
    rules = dict(DEFAULT_RULES)
    for name, target in (mesh_config.rules or {}).items():
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        for axis in targets:
            if axis not in AXES:
                raise MeshError(
                    f"mesh.rules.{name} maps to unknown mesh axis {axis!r}; use one of {AXES}"
                )
        rules[name] = tuple(target) if isinstance(target, list) else target
    return rules


def resolve_axes(mesh_config: MeshConfig, num_devices: int) -> dict[str, int]:
    """Axis sizes with the -1 axis filled in; raises MeshError if they do not fit the devices."""
    sizes = {a: getattr(mesh_config, a) for a in AXES}
    fixed = math.prod(s for s in sizes.values() if s != -1)
    free = [a for a, s in sizes.items() if s == -1]
    if free:
        if num_devices % fixed:
            raise MeshError(
                f"mesh {_fmt(sizes)} cannot fill {num_devices} devices: the fixed axes multiply "
                f"to {fixed}, which does not divide {num_devices}"
            )
        sizes[free[0]] = num_devices // fixed
    total = math.prod(sizes.values())
    if total != num_devices:
        raise MeshError(
            f"mesh {_fmt(sizes)} needs {total} devices but {num_devices} are available; set the "
            f"axes so they multiply to {num_devices} (or set one of them to -1)"
        )
    return sizes


def build_mesh(
    mesh_config: MeshConfig, devices: Sequence[jax.Device] | None = None
) -> jax.sharding.Mesh:
    """A `Mesh` over `devices` (default: all) with axes data, fsdp, tensor, expert."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_axes(mesh_config, len(devices))
    shape = tuple(sizes[a] for a in AXES)
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.make_mesh(shape, AXES, axis_types=auto, devices=devices)


def abstract_mesh(sizes: Mapping[str, int]) -> jax.sharding.AbstractMesh:
    """A device-free mesh of the given axis sizes, for ahead-of-time lowering."""
    shape = tuple(sizes[a] for a in AXES)
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.sharding.AbstractMesh(shape, AXES, axis_types=auto)


def data_parallel_size(sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[a] for a in BATCH_AXES)


def check_batch(config: Config, sizes: Mapping[str, int], process_count: int = 1) -> None:
    """Raises MeshError naming the numbers to change when the batch does not divide the mesh."""
    dp = data_parallel_size(sizes)
    accum = config.train.grad_accum
    batch = config.data.batch_size
    micro = batch // accum
    if micro % dp:
        lo = dp * accum * max(1, micro // dp)
        raise MeshError(
            f"data.batch_size={batch} with train.grad_accum={accum} gives micro-batches of "
            f"{micro} sequences, which do not split over the {dp} data-parallel devices "
            f"(mesh data={sizes['data']} x fsdp={sizes['fsdp']} x expert={sizes['expert']}). "
            f"Set data.batch_size to a multiple of {dp * accum} (e.g. {lo} or {lo + dp * accum}), "
            f"or lower train.grad_accum, or change mesh.data/mesh.fsdp so they divide {micro}."
        )
    if batch % process_count:
        raise MeshError(
            f"data.batch_size={batch} does not split over {process_count} processes; "
            f"make it a multiple of {process_count}"
        )


def batch_sharding(mesh: Any, rules: Mapping[str, Any] | None = None) -> NamedSharding:
    """Batch arrays [B, T]: B over the data-parallel axes, T as the `seq` rule says."""
    rules = DEFAULT_RULES if rules is None else rules
    return NamedSharding(mesh, PartitionSpec(rules["batch"], rules.get("seq")))


def fit_spec(spec: PartitionSpec, shape: Sequence[int], sizes: Mapping[str, int]) -> PartitionSpec:
    """Drops mesh axes that do not divide their dimension (that dimension is then replicated)."""
    out = []
    for i, dim in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        kept = []
        for axis in axes:
            if sizes[axis] > 1 and dim % (math.prod(sizes[a] for a in kept) * sizes[axis]) == 0:
                kept.append(axis)
        out.append(tuple(kept) if len(kept) > 1 else (kept[0] if kept else None))
    while out and out[-1] is None:
        out.pop()
    return PartitionSpec(*out)


def param_shardings(params: Any, specs: Any, mesh: Any) -> Any:
    """NamedShardings with the structure of `params` (arrays or ShapeDtypeStructs).

    `specs` may be a prefix of `params` (nnlib puts one PartitionSpec where each nnx.Variable
    sits); every array under a spec gets that spec, fitted to its shape.
    """
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))

    def under(spec: PartitionSpec | None, subtree: Any) -> Any:
        return jax.tree.map(
            lambda x: NamedSharding(mesh, fit_spec(spec or PartitionSpec(), np.shape(x), sizes)),
            subtree,
        )

    return jax.tree.map(under, specs, params, is_leaf=lambda x: x is None or _is_spec(x))


def state_shardings(tree: Any, params: Any, params_shardings: Any, mesh: Any) -> Any:
    """Shardings for any tree (e.g. optimiser state) whose leaves mirror parameters.

    A leaf whose key path ends with a parameter's path and has that parameter's shape takes the
    parameter's sharding; anything else is replicated.
    """
    by_path: dict[tuple[str, ...], tuple[tuple[int, ...], Any]] = {}
    flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_s = jax.tree_util.tree_leaves(params_shardings, is_leaf=_is_sharding)
    for (path, leaf), sharding in zip(flat_p, flat_s, strict=True):
        by_path[_path_key(path)] = (tuple(np.shape(leaf)), sharding)
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(path: Any, leaf: Any) -> Any:
        key = _path_key(path)
        for start in range(len(key)):
            hit = by_path.get(key[start:])
            if hit is not None and hit[0] == tuple(np.shape(leaf)):
                return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, tree)


def path_str(path: Any) -> str:
    """A key path as the project's parameter name, e.g. `layers/3/attn/q_proj/kernel`.

    `jax.tree_util.keystr(..., simple=True, separator="/")` after dropping a final
    `GetAttrKey("value")` (Flax NNX's Variable wrapper; a dict key named "value" stays).
    """
    path = tuple(path)
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _path_key(path: Any) -> tuple[str, ...]:
    name = path_str(path)
    return tuple(name.split("/")) if name else ()


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


def _is_sharding(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding)


def _fmt(sizes: Mapping[str, int]) -> str:
    return " x ".join(f"{a}={s}" for a, s in sizes.items())
