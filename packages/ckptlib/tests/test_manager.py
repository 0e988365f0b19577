import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ckptlib_testutil import assert_trees_equal, make_state

from jaxstack.ckptlib import (
    CheckpointExistsError,
    CheckpointManager,
    CheckpointNotFoundError,
    CheckpointSaveError,
    Error,
    Restored,
    TargetMismatchError,
)


def abstract(tree):
    return jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array)
            else x
        ),
        tree,
    )


@pytest.mark.parametrize("async_save", [True, False])
def test_save_restore_roundtrip_is_bitwise_with_and_without_target(tmp_path, state, async_save):
    data_state = {"epoch": 1, "positions": [3, 5], "seed": 0}
    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        mgr.save(7, state, data_state=data_state, metadata={"config": {"d": 16}})
        mgr.wait()
        assert mgr.latest_step() == 7 and mgr.all_steps() == [7]
        with_target = mgr.restore(target=abstract(state))
        without = mgr.restore()
    assert isinstance(with_target, Restored) and with_target.step == 7
    assert with_target.data_state == data_state
    assert with_target.metadata == {"config": {"d": 16}}
    assert_trees_equal(with_target.state, state)
    # No target: the saved structure comes back, optax NamedTuples included.
    assert_trees_equal(without.state, state)
    assert type(without.state["opt_state"][0]) is optax.ScaleByAdamState
    assert without.state["params"]["norm"]["scale"].dtype == jnp.bfloat16


def test_numpy_and_python_scalar_leaves_keep_their_kind(tmp_path):
    state = {"np": np.arange(4, dtype=np.int16), "i": 3, "f": 0.5, "b": True, "g": np.float32(2)}
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        restored = mgr.restore().state
        targeted = mgr.restore(target=state).state
    for out in (restored, targeted):
        assert isinstance(out["np"], np.ndarray) and out["np"].dtype == np.int16
        assert out["i"] == 3 and type(out["i"]) is int
        assert out["f"] == 0.5 and type(out["f"]) is float
        assert out["b"] is True
        np.testing.assert_array_equal(out["np"], state["np"])
    assert type(targeted["g"]) is np.float32


def test_save_snapshots_numpy_and_json_inputs(tmp_path):
    weights = np.ones(1000, np.float32)
    data_state = {"pos": 1}
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, {"w": weights}, data_state=data_state)
        weights[:] = 5.0  # the training loop reuses its buffers while the save is in flight
        data_state["pos"] = 99
        mgr.wait()
        restored = mgr.restore()
    np.testing.assert_array_equal(restored.state["w"], np.ones(1000, np.float32))
    assert restored.data_state == {"pos": 1}


def test_latest_step_never_reports_a_save_in_flight(tmp_path, state):
    release = threading.Event()
    reached = threading.Event()

    def hold(step):
        reached.set()
        assert release.wait(60)

    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        mgr.wait()
        mgr._before_commit_hook = hold
        mgr.save(2, state)
        assert reached.wait(60)  # arrays written, manifest written, not yet renamed
        assert mgr.latest_step() == 1 and mgr.all_steps() == [1]
        reader = CheckpointManager(tmp_path, read_only=True)  # e.g. an eval job
        assert reader.latest_step() == 1 and reader.restore().step == 1
        release.set()
        mgr.wait()
        assert mgr.latest_step() == 2


def test_failed_async_save_is_reported_and_never_committed(tmp_path, state):
    def fail(step):
        raise OSError(28, "No space left on device")

    mgr = CheckpointManager(tmp_path, max_to_keep=1)
    mgr.save(1, state)
    mgr.wait()
    mgr._before_commit_hook = fail
    mgr.save(2, state)
    with pytest.raises(CheckpointSaveError, match=r"step 2.*No space left"):
        mgr.wait()
    assert mgr.latest_step() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["save-errors.log", "step_00000001"]
    mgr._before_commit_hook = None
    mgr.save(3, state)  # the manager is still usable
    mgr.close()
    assert mgr.all_steps() == [3]


def test_failure_of_previous_save_is_raised_by_next_save(tmp_path, state):
    mgr = CheckpointManager(tmp_path)
    mgr._before_commit_hook = lambda step: 1 / 0
    mgr.save(1, state)
    with pytest.raises(CheckpointSaveError, match="ZeroDivisionError"):
        mgr.save(2, state)
    mgr.close()
    assert mgr.latest_step() is None


def test_leftover_tmp_dirs_are_removed_on_start(tmp_path, state):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
    crashed = tmp_path / ".tmp-step_00000002" / "state"
    crashed.mkdir(parents=True)
    (crashed / "half_written").write_bytes(b"x" * 10)
    (tmp_path / ".tmp-delete-step_00000000").mkdir()
    assert CheckpointManager(tmp_path, read_only=True).latest_step() == 1
    assert (tmp_path / ".tmp-step_00000002").exists()  # read-only never deletes
    mgr = CheckpointManager(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]
    assert len(mgr.removed_tmp_dirs) == 2
    assert mgr.latest_step() == 1


def test_existing_step_and_bad_inputs_are_refused(tmp_path, state):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        mgr.wait()
        with pytest.raises(CheckpointExistsError, match="step 1 already exists"):
            mgr.save(1, state)
        with pytest.raises(Error, match="data_state must be JSON"):
            mgr.save(2, state, data_state={"it": object()})
        with pytest.raises(Error, match="type object"):
            mgr.save(2, {"w": object()})
        with pytest.raises(Error, match="step=-1"):
            mgr.save(-1, state)
        assert mgr.all_steps() == [1]


def test_missing_directory_and_step_are_clear_errors(tmp_path, state):
    missing = tmp_path / "nope"
    with pytest.raises(CheckpointNotFoundError, match="nope does not exist"):
        CheckpointManager(missing, create=False)
    with CheckpointManager(tmp_path) as mgr:
        with pytest.raises(CheckpointNotFoundError, match="no good checkpoint"):
            mgr.restore()
        mgr.save(5, state)
        mgr.wait()
        with pytest.raises(CheckpointNotFoundError, match=r"step 6 .*good steps there: \[5\]"):
            mgr.restore(6)


def test_target_mismatch_names_the_first_paths(tmp_path, state):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        bad = abstract(state)
        bad["params"]["embed"] = jax.ShapeDtypeStruct((31, 16), jnp.float32)
        del bad["params"]["norm"]
        with pytest.raises(TargetMismatchError) as info:
            mgr.restore(target=bad)
    message = str(info.value)
    assert "params/embed: checkpoint shape (32, 16), target shape (31, 16)" in message
    assert "params/norm/scale: in the checkpoint, not in the target" in message


def test_subtree_restore_reads_only_params(tmp_path, state):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        params = mgr.restore(subtree="params").state
        targeted = mgr.restore(subtree="params", target=abstract(state["params"])).state
    assert_trees_equal(params, state["params"])
    assert_trees_equal(targeted, state["params"])


def test_restore_casts_to_target_dtype(tmp_path):
    state = make_state(1)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        target = {"embed": jax.ShapeDtypeStruct((32, 16), jnp.bfloat16)}
        out = mgr.restore(subtree="params/embed", target=None).state
        cast = mgr.restore(subtree="params", target={**abstract(state["params"]), **target})
    np.testing.assert_array_equal(out, state["params"]["embed"])
    assert cast.state["embed"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        cast.state["embed"], state["params"]["embed"].astype(jnp.bfloat16)
    )


def test_typed_prng_keys_roundtrip(tmp_path):
    state = {"rng": jax.random.key(3), "keys": jax.random.split(jax.random.key(4, impl="rbg"), 3)}
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        restored = mgr.restore().state
        abstract_keys = jax.eval_shape(lambda: state)
        targeted = mgr.restore(target=abstract_keys).state
    for out in (restored, targeted):
        assert jax.random.key_impl(out["keys"]) == jax.random.key_impl(state["keys"])
        np.testing.assert_array_equal(
            jax.random.key_data(out["rng"]), jax.random.key_data(state["rng"])
        )
        np.testing.assert_array_equal(
            jax.random.key_data(out["keys"]), jax.random.key_data(state["keys"])
        )
