"""On disk: ckptlib round trips are bit-exact with int codes kept int; safetensors export."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstack import ckptlib
from jaxstack import quantlib as ql

RULES = (
    ql.QuantRule(r"attn/(q|k)_proj$", "int4", tile_size=64),
    ql.QuantRule(r"attn/v_proj$", "nf4", tile_size=64),
    ql.QuantRule(r"attn/o_proj$", "fp8_e4m3"),
    ql.QuantRule(r"mlp/up_proj$", "fp8_e5m2"),
    ql.QuantRule(".*", "int8", act_qtype="int8", act_static=True),
)


@pytest.fixture
def qmodel(model, batch):
    return ql.quantize(model, ql.PtqProvider(RULES), calibration=[batch])


def test_ckptlib_round_trip_is_bit_exact_and_keeps_int_codes(qmodel, tmp_path):
    state = nnx.state(qmodel)
    with ckptlib.CheckpointManager(tmp_path / "ckpt", async_save=False) as manager:
        manager.save(7, {"model": state})
    saved_dtypes = {
        "/".join(leaf["path"]): leaf["dtype"]
        for leaf in ckptlib.read_manifest(tmp_path / "ckpt", 7)["leaves"]
    }
    assert saved_dtypes["model/layers/0/attn/q_proj/kernel/value/values"] == "uint8"
    assert saved_dtypes["model/layers/0/mlp/down_proj/kernel/value/values"] == "int8"
    assert saved_dtypes["model/layers/0/attn/o_proj/kernel/value/values"] == "float8_e4m3fn"

    target = jax.tree.map(jnp.zeros_like, state)
    with ckptlib.CheckpointManager(tmp_path / "ckpt", read_only=True) as manager:
        restored = manager.restore(target={"model": target}).state["model"]
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        assert a.dtype == b.dtype
        raw = lambda x: np.asarray(x).reshape(-1).view(np.uint8)  # bits, also of floats
        np.testing.assert_array_equal(raw(a), raw(b))
    nnx.update(qmodel, restored)  # the restored state drops back into the model


def test_save_and_load_quantized_reproduces_the_logits(qmodel, small_config, batch, tmp_path):
    out = ql.save_quantized(
        qmodel, tmp_path / "q", rules=RULES, model_config=small_config, info={"note": "test"}
    )
    loaded, record = ql.load_quantized(out)
    assert record["note"] == "test" and record["rules"][0]["weight_qtype"] == "int4"
    args = batch["tokens"], batch["positions"]
    np.testing.assert_array_equal(loaded(*args)[0], qmodel(*args)[0])
    with pytest.raises(ql.SourceError, match="already exists; choose a new output directory"):
        ql.save_quantized(qmodel, out, rules=RULES, model_config=small_config, info={})


def test_a_bad_rule_in_quant_json_names_the_file_and_the_rule(qmodel, small_config, tmp_path):
    out = ql.save_quantized(qmodel, tmp_path / "q", rules=RULES, model_config=small_config, info={})
    info = out / "quant.json"
    record = json.loads(info.read_text())
    record["rules"][1]["act_static"] = "yes"
    info.write_text(json.dumps(record))
    with pytest.raises(ql.RuleError) as error:
        ql.load_quantized(out)
    assert (
        str(error.value)
        == f"{info}: rule 1: act_static: Input should be a valid boolean, got 'yes'"
    )


def test_safetensors_export_holds_codes_scales_and_the_layout(qmodel, tmp_path):
    path = tmp_path / "model.safetensors"
    ql.export_safetensors(qmodel, path, RULES)
    tensors = ckptlib.load_safetensors(path, flat=True)
    codes = tensors["layers.1.attn.q_proj.weight"]
    scales = tensors["layers.1.attn.q_proj.weight_scale"]
    assert codes.dtype == np.uint8 and codes.shape == (64, 128)  # [K/2, N] packed int4
    assert scales.shape == (2, 128)
    assert tensors["layers.0.mlp.down_proj.input_scale"].shape == ()
    assert tensors["embed"].dtype == np.float32
    fp8 = tensors["layers.0.attn.o_proj.weight"]  # float8 bit patterns, stored as bytes
    np.testing.assert_array_equal(
        fp8.view(jnp.float8_e4m3fn), qmodel.layers[0].attn.o_proj.kernel.get_value().values
    )
    header = json.loads(safetensors_metadata(path)["quantization_config"])
    layout = header["weights"]["layers.1.attn.q_proj.weight"]
    assert layout == {
        "qtype": "int4",
        "shape": [128, 2, 64],
        "dtype": "float32",
        "contract_ndim": 1,
        "tile_size": 64,
    }
    # A reader that follows the header gets the model's weight back.
    low, high = codes & 0xF, codes >> 4
    nibbles = np.stack([low, high], axis=1).reshape(128, 128).astype(np.int8)
    signed = (nibbles ^ 8) - 8
    dense = (signed.reshape(2, 64, 128) * scales[:, None, :]).reshape(128, 2, 64)
    expected = qmodel.layers[1].attn.q_proj.kernel.get_value().dequantize()
    np.testing.assert_array_equal(dense, expected)


def safetensors_metadata(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]
