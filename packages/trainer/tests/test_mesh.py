import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxstack.trainer import MeshConfig, MeshError, load_config, resolve_axes
from jaxstack.trainer._src.mesh import check_batch, fit_spec, logical_rules


def test_resolve_axes_fills_the_free_axis():
    assert resolve_axes(MeshConfig(data=-1, fsdp=2), 8) == {
        "data": 4,
        "fsdp": 2,
        "tensor": 1,
        "expert": 1,
    }
    assert resolve_axes(MeshConfig(data=1, fsdp=4, tensor=2), 8)["tensor"] == 2


def test_resolve_axes_errors_say_what_to_change():
    with pytest.raises(MeshError, match="needs 6 devices but 8"):
        resolve_axes(MeshConfig(data=3, fsdp=2), 8)
    with pytest.raises(MeshError, match="does not divide 8"):
        resolve_axes(MeshConfig(data=-1, fsdp=3), 8)


def test_batch_not_dividing_the_mesh_names_the_numbers():
    config = load_config("tiny", ["data.batch_size=6", "train.grad_accum=1"])
    sizes = {"data": 4, "fsdp": 1, "tensor": 1, "expert": 1}
    with pytest.raises(MeshError) as e:
        check_batch(config, sizes)
    message = str(e.value)
    assert "data.batch_size=6" in message and "multiple of 4" in message
    check_batch(load_config("tiny", ["data.batch_size=8"]), sizes)


def test_fit_spec_drops_axes_that_do_not_divide():
    sizes = {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    assert fit_spec(P("tensor", "fsdp"), (259, 32), sizes) == P(None, "fsdp")
    assert fit_spec(P(("data", "fsdp"), None), (8, 3), sizes) == P(("data", "fsdp"))
    assert fit_spec(P(("data", "fsdp")), (6,), sizes) == P("data")


def test_rules_overrides_are_checked():
    rules = logical_rules(MeshConfig(rules={"vocab": None, "embed": ["fsdp", "data"]}))
    assert rules["vocab"] is None and rules["embed"] == ("fsdp", "data")
    with pytest.raises(MeshError, match="unknown mesh axis 'model'"):
        logical_rules(MeshConfig(rules={"mlp": "model"}))


def test_build_mesh_has_the_four_axes():
    from jaxstack.trainer import build_mesh

    mesh = build_mesh(MeshConfig())
    assert mesh.axis_names == ("data", "fsdp", "tensor", "expert")
    assert mesh.devices.size == jax.device_count()


def test_parameter_paths_follow_the_project_convention():
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxstack import nnlib
    from jaxstack.trainer._src.mesh import path_str

    cfg = nnlib.get_preset("tiny").replace(
        num_layers=1, d_model=16, num_heads=2, num_kv_heads=2, head_dim=8, mlp_dim=32, vocab_size=32
    )
    model = nnx.eval_shape(lambda: nnlib.Transformer(cfg, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    names = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    assert all(not n.endswith("/value") for n in names)
    assert any(n.startswith("layers/0/") and n.endswith("/kernel") for n in names)
    opt = jax.eval_shape(optax.adam(1e-3).init, {"w": {"value": jnp.zeros(2)}})
    opt_names = {path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(opt)[0]}
    # a dict key named "value" is a real name and stays
    assert {"0/mu/w/value", "0/nu/w/value", "0/count"} == opt_names
