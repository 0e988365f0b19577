import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from ckptlib_testutil import assert_trees_equal
from safetensors import safe_open

from jaxstack.ckptlib import (
    CheckpointManager,
    CheckpointNotFoundError,
    Error,
    export_params,
    load_safetensors,
    save_safetensors,
)


def to_hf(path: str) -> str | None:
    """A toy nnlib -> HF name map (the real one lives in nnlib)."""
    if path == "norm/scale":
        return "model.norm.weight"
    if path.startswith("layers/"):
        _, i, name = path.split("/")
        return f"model.layers.{i}.mlp.{'weight' if name == 'kernel' else name}"
    return None  # dropped


def from_hf(name: str) -> str:
    if name == "model.norm.weight":
        return "norm/scale"
    _, _, i, _, leaf = name.split(".")
    return f"layers/{i}/{'kernel' if leaf == 'weight' else leaf}"


def test_roundtrip_with_a_name_map_and_bfloat16(tmp_path, state):
    params = state["params"]
    names = save_safetensors(params, tmp_path / "m.safetensors", name_map=to_hf)
    assert names == ["model.layers.0.mlp.weight", "model.layers.1.mlp.weight", "model.norm.weight"]
    with safe_open(tmp_path / "m.safetensors", framework="numpy") as f:  # any reader works
        assert sorted(f.keys()) == names
        assert f.get_tensor("model.norm.weight").dtype == ml_dtypes.bfloat16
    back = load_safetensors(tmp_path / "m.safetensors", name_map=from_hf)
    assert back["layers"].keys() == {"0", "1"}
    np.testing.assert_array_equal(back["layers"]["1"]["kernel"], params["layers"][1]["kernel"])
    np.testing.assert_array_equal(back["norm"]["scale"], params["norm"]["scale"])
    flat = load_safetensors(tmp_path / "m.safetensors", flat=True)
    assert set(flat) == set(names)


def test_dict_name_map_and_errors(tmp_path):
    params = {"a": jnp.ones(2), "b": jnp.zeros(3, jnp.int8)}
    save_safetensors(params, tmp_path / "x.safetensors", name_map={"a": "alpha"})
    flat = load_safetensors(tmp_path / "x.safetensors", flat=True)
    assert set(flat) == {"alpha", "b"} and flat["b"].dtype == np.int8
    with pytest.raises(Error, match="maps two leaves to 'same'"):
        save_safetensors(params, tmp_path / "y.safetensors", name_map=lambda p: "same")
    with pytest.raises(CheckpointNotFoundError, match=r"missing\.safetensors does not exist"):
        load_safetensors(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("fmt", ["safetensors", "orbax"])
def test_params_only_export_for_serving(tmp_path, state, fmt):
    with CheckpointManager(tmp_path / "ckpt") as mgr:
        mgr.save(4, state)
    out = export_params(tmp_path / "ckpt", tmp_path / f"serve.{fmt}", format=fmt)
    if fmt == "safetensors":
        back = load_safetensors(out)
        back["layers"] = [back["layers"]["0"], back["layers"]["1"]]
    else:
        back = ocp.StandardCheckpointer().restore(out.absolute())
    assert set(back) == {"embed", "layers", "norm"}  # no optimizer state
    assert_trees_equal(
        {k: np.asarray(v) if not isinstance(v, dict | list) else v for k, v in back.items()},
        {k: v for k, v in state["params"].items()},
    )
