"""Both directions of Orbax interop, exactly as docs/ckptlib.md shows them."""

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from ckptlib_testutil import assert_trees_equal
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxstack.ckptlib import CheckpointManager, restore_orbax


def abstract(tree):
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def test_plain_orbax_restores_what_ckptlib_wrote(tmp_path, state):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(12, state)
    state_dir = tmp_path / "step_00000012" / "state"
    # 1. A plain PyTree checkpoint: StandardCheckpointer with an abstract target.
    restored = ocp.StandardCheckpointer().restore(state_dir, abstract(state))
    assert_trees_equal(restored, state)
    # 2. Orbax's own CheckpointManager, read-only, with our step naming.
    options = ocp.CheckpointManagerOptions(
        step_prefix="step", step_format_fixed_length=8, read_only=True
    )
    orbax_mgr = ocp.CheckpointManager(tmp_path, options=options, item_names=("state",))
    assert orbax_mgr.latest_step() == 12
    out = orbax_mgr.restore(
        12, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract(state)))
    )
    assert_trees_equal(out["state"], state)


def test_ckptlib_restores_a_plain_orbax_checkpoint(tmp_path, state):
    path = tmp_path / "orbax"
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    # Without a target: Orbax's saved structure (NamedTuples were written as dicts).
    plain = restore_orbax(path)
    assert set(plain["opt_state"][0]) == {"count", "mu", "nu"}
    np.testing.assert_array_equal(plain["params"]["embed"], state["params"]["embed"])
    # With a target: the exact structure (optax NamedTuples) and new shardings.
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    target = jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P()))
            if isinstance(x, jax.Array)
            else x
        ),
        state,
    )
    restored = restore_orbax(path, target=target)
    assert_trees_equal(restored, state)
    assert type(restored["opt_state"][0]) is optax.ScaleByAdamState
    assert restored["params"]["embed"].sharding == NamedSharding(mesh, P())
    params = restore_orbax(path, subtree="params")
    assert set(params) == {"embed", "layers", "norm"}


def test_an_orbax_checkpoint_manager_run_restores_item_by_item(tmp_path, state):
    orbax_mgr = ocp.CheckpointManager(tmp_path / "run")
    orbax_mgr.save(3, args=ocp.args.StandardSave(state))
    orbax_mgr.wait_until_finished()
    restored = restore_orbax(tmp_path / "run" / "3" / "default", target=abstract(state))
    assert_trees_equal(restored, state)
