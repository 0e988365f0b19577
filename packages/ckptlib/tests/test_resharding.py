import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ckptlib_testutil import assert_trees_equal
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from jaxstack.ckptlib import CheckpointManager


def sharded_state(mesh, specs):
    rng = np.random.default_rng(0)
    params = {
        "w": jax.device_put(
            jnp.asarray(rng.standard_normal((16, 8), dtype=np.float32)),
            NamedSharding(mesh, specs["w"]),
        ),
        "b": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, specs["b"])),
    }
    return {"params": params, "opt_state": optax.adam(1e-3).init(params), "step": 3}


@pytest.fixture(scope="module")
def devices():
    if jax.device_count() < 8:
        pytest.fail(
            "needs 8 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8 "
            "(conftest sets it unless JAX was imported first)"
        )
    return jax.devices()


def to_target(state, sharding_for):
    return jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding_for(x))
            if isinstance(x, jax.Array)
            else x
        ),
        state,
    )


@pytest.mark.parametrize(
    "new_mesh_shape, new_spec",
    [((2, 4), P("x", "y")), ((8,), P(None, "x")), ((1,), None)],
    ids=["2x4", "8-columns", "single-device"],
)
def test_restore_onto_a_different_mesh(tmp_path, devices, new_mesh_shape, new_spec):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    state = sharded_state(mesh, {"w": P("data", "model"), "b": P("model")})
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(3, state)
        mgr.wait()
        names = ("x", "y")[: len(new_mesh_shape)]
        new_mesh = jax.make_mesh(new_mesh_shape, names, devices=devices[: np.prod(new_mesh_shape)])

        def sharding_for(x):
            if new_spec is None:
                return SingleDeviceSharding(devices[5])
            return NamedSharding(new_mesh, new_spec if x.ndim == 2 else P())

        target = to_target(state, sharding_for)
        restored = mgr.restore(target=target).state
    assert_trees_equal(restored, state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True):
        if isinstance(want, jax.ShapeDtypeStruct):
            assert got.sharding == want.sharding
    w = restored["params"]["w"]
    for shard in w.addressable_shards:  # each device holds only its new slice
        assert shard.data.shape == target["params"]["w"].sharding.shard_shape((16, 8))
        np.testing.assert_array_equal(shard.data, np.asarray(state["params"]["w"])[shard.index])


def test_restore_without_target_puts_saved_sharded_arrays_on_one_device(tmp_path, devices):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    state = sharded_state(mesh, {"w": P("data", "model"), "b": P("model")})
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(3, state)
        restored = mgr.restore().state
    assert_trees_equal(restored, state)
    assert restored["params"]["w"].sharding == SingleDeviceSharding(jax.local_devices()[0])
