import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from nnlib_testutil import SMALL, make

from jaxstack import nnlib

RULES = {
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "vocab": "tensor",
    "layers": "fsdp",
    "experts": "expert",
}


def is_tuple(x):
    return isinstance(x, tuple)


def test_every_param_has_logical_axes_matching_its_rank():
    model = make()
    params = nnx.state(model, nnx.Param)
    axes = nnlib.logical_axes(model)
    arrays = jax.tree.leaves(params)
    names = jax.tree.leaves(axes, is_leaf=is_tuple)
    assert len(arrays) == len(names)
    for a, n in zip(arrays, names, strict=True):
        assert len(n) == a.ndim
    assert axes["layers"][0]["attn"]["q_proj"]["kernel"] == ("embed", "heads", "head_dim")
    assert axes["embed"] == ("vocab", "embed")


def test_partition_specs_follow_rules_and_scanned_layer_axis():
    model = make(scan_layers=True)
    params = nnx.state(model, nnx.Param)
    specs = nnlib.partition_specs(params, RULES)
    assert specs["layers"]["attn"]["q_proj"]["kernel"] == PartitionSpec(
        "fsdp", None, "tensor", None
    )
    # "fsdp" is taken by the layers axis, so embed stays unsharded there (one use per mesh axis).
    assert specs["layers"]["mlp"]["down_proj"]["kernel"] == PartitionSpec("fsdp", "tensor", None)
    assert specs["embed"] == PartitionSpec("tensor", "fsdp")


def test_scanned_params_really_shard_over_the_layer_axis():
    devices = np.array(jax.devices()[:4])
    if devices.size < 4:
        return
    mesh = jax.sharding.Mesh(devices.reshape(2, 2), ("fsdp", "tensor"))
    model = nnlib.Transformer(SMALL.replace(scan_layers=True, vocab_size=96), rngs=nnx.Rngs(0))
    apply, params = nnlib.as_function(model)
    specs = nnlib.partition_specs(params, RULES)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    sharded = jax.device_put(params, shardings)
    kernel = sharded["layers"]["attn"]["q_proj"]["kernel"][...]
    assert kernel.sharding.spec == PartitionSpec("fsdp", None, "tensor", None)
    assert kernel.addressable_shards[0].data.shape == (1, 32, 2, 8)
    tokens = jnp.zeros((2, 8), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(8), (2, 8))
    logits, _ = jax.jit(apply)(sharded, tokens, positions)
    ref, _ = jax.jit(apply)(params, tokens, positions)
    assert float(jnp.abs(logits - ref).max()) < 1e-5


def test_logical_axes_and_specs_of_an_abstract_model_equal_the_concrete_ones():
    abstract = nnx.eval_shape(lambda: make(scan_layers=True))
    concrete = make(scan_layers=True)
    assert nnlib.logical_axes(abstract) == nnlib.logical_axes(concrete)
    abstract_specs = nnlib.partition_specs(nnx.state(abstract, nnx.Param), RULES)
    assert abstract_specs == nnlib.partition_specs(nnx.state(concrete, nnx.Param), RULES)
