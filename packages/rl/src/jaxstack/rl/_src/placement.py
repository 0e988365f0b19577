"""Where each role of an online run lives: actor, reference and rollout engine on device meshes.

    roles.<role>.devices (indices into jax.devices()) + roles.<role>.mesh (the trainer's axes)
      -> a `Placement`: the trainer's mesh over those devices and its logical-axis rules

A role's parameters are laid out by the trainer's rules (nnlib's logical axes -> mesh axes, an
axis that does not divide a dimension dropped); batches are split on their leading axis over the
data-parallel axes. Arrays move between roles with `jax.device_put` (the actor's weights to the
rollout engine each iteration, the starting weights to the reference, the reference's log-probs
back to the actor), never through the host's disk. On CPU the "devices" are virtual host devices
(`--xla_force_host_platform_device_count`), so the same config runs anywhere.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxstack.rl._src.config import RLConfig
from jaxstack.rl._src.errors import ConfigError

ROLES = ("actor", "reference", "rollout")


@dataclasses.dataclass(frozen=True)
class Placement:
    """One role's mesh and logical-axis rules."""

    role: str
    mesh: jax.sharding.Mesh
    rules: dict[str, Any]

    def param_shardings(self, params: Any) -> Any:
        from jaxstack import trainer

        return trainer.param_shardings(params, _specs(params, self.rules), self.mesh)

    def put(self, params: Any) -> Any:
        """`params` (an nnx State of the model's parameters) laid out on this role's mesh."""
        return jax.device_put(params, self.param_shardings(params))

    def put_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A train state `{"params", "opt_state", "step"}` on this mesh: optimiser leaves take
        their parameter's sharding, counters are replicated. `params` may hold the model's
        parameters under a key (PPO's `{"policy", "value_head"}`)."""
        from jaxstack import trainer

        params = state["params"]
        shardings = trainer.state_shardings(state, params, self.param_shardings(params), self.mesh)
        return jax.device_put(state, shardings)

    def put_batch(self, batch: Any) -> Any:
        """Arrays `[rows, ...]` split on rows over the data-parallel axes (the trainer's batch
        layout)."""
        from jaxstack import trainer

        spec = trainer.batch_sharding(self.mesh, self.rules).spec

        def sharding(x: Any) -> NamedSharding:
            return NamedSharding(self.mesh, PartitionSpec(*spec[: jax.numpy.ndim(x)]))

        return jax.device_put(batch, jax.tree.map(sharding, batch))

    def put_replicated(self, x: Any) -> Any:
        """Arrays copied whole to every device of this mesh (an index into the batch)."""
        return jax.device_put(x, NamedSharding(self.mesh, PartitionSpec()))

    def data_parallel_size(self) -> int:
        axes = self.rules["batch"]
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        return math.prod(self.mesh.shape[a] for a in axes)


def _specs(params: Any, rules: dict[str, Any]) -> Any:
    """nnlib's specs for the model's parameters; other leaves (a value head) replicated."""
    from flax import nnx

    from jaxstack import nnlib

    if isinstance(params, nnx.State):
        return nnlib.partition_specs(params, rules)
    if isinstance(params, dict):
        return {k: _specs(v, rules) for k, v in params.items()}
    return PartitionSpec()


def place_role(config: RLConfig, role: str) -> Placement:
    """The `roles.<role>` mesh; a ConfigError when it does not fit this host's devices."""
    from jaxstack import trainer

    section = getattr(config.roles, role)
    available = jax.devices()
    if section.devices is None:
        devices = available
    else:
        missing = [i for i in section.devices if i >= len(available)]
        if missing:
            raise ConfigError(
                f"roles.{role}.devices={section.devices}: device {missing[0]} does not exist; "
                f"this host has {len(available)} (indices 0-{len(available) - 1})"
            )
        devices = [available[i] for i in section.devices]
    mesh_config = section.mesh or config.base.mesh
    key = f"roles.{role}.mesh" if section.mesh else "mesh"
    try:
        mesh = trainer.build_mesh(mesh_config, devices)
        rules = trainer.logical_rules(mesh_config)
    except trainer.MeshError as e:
        raise ConfigError(f"{key}: {e} (roles.{role} has {len(devices)} devices)") from None
    return Placement(role, mesh, rules)


def place_roles(config: RLConfig) -> dict[str, Placement]:
    """Every role's placement, checked against the devices and the rollout batch's rows."""
    roles = {role: place_role(config, role) for role in ROLES}
    rows = config.base.data.batch_size * config.rollout.group_size
    for role in ("actor", "reference"):
        size = roles[role].data_parallel_size()
        if rows % size:
            raise ConfigError(
                f"data.batch_size x rollout.group_size = {rows} rows do not split over the "
                f"{size} data-parallel devices of roles.{role}; make the rows a multiple of "
                f"{size} or shrink that role's mesh.data/mesh.fsdp"
            )
    return roles
