"""HF interop: logits parity against fixtures written by tools/make_hf_fixtures.py (no torch)."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from nnlib_testutil import forward, max_diff
from safetensors import safe_open
from safetensors.numpy import load_file

from jaxstack import nnlib

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "qwen3_moe"]


def io(family):
    data = load_file(str(FIXTURES / family / "io.safetensors"))
    tokens = jnp.asarray(data["tokens"])
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    return tokens, positions, data["logits"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf_transformers(family):
    tokens, positions, want = io(family)
    model = nnlib.load_hf_checkpoint(FIXTURES / family)
    assert model.config.family == family
    got, _ = forward(model, tokens, positions)
    assert max_diff(got, want) <= 1e-4


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_scanned_layers_load_the_same_weights(family):
    tokens, positions, want = io(family)
    model = nnlib.load_hf_checkpoint(FIXTURES / family, scan_layers=True)
    assert max_diff(forward(model, tokens, positions)[0], want) <= 1e-4


def test_sharded_checkpoint_with_index_json():
    tokens, positions, want = io("llama")
    assert (FIXTURES / "llama-sharded" / "model.safetensors.index.json").exists()
    model = nnlib.load_hf_checkpoint(FIXTURES / "llama-sharded")
    assert max_diff(forward(model, tokens, positions)[0], want) <= 1e-4


@pytest.mark.parametrize(
    "family,shard",
    [pytest.param("qwen2", None, marks=pytest.mark.slow), ("gemma2", 3000), ("mixtral", None)],
)
def test_export_round_trip(tmp_path, family, shard):
    model = nnlib.load_hf_checkpoint(FIXTURES / family)
    out = nnlib.save_hf_checkpoint(model, tmp_path / "export", max_shard_bytes=shard)
    original = {}
    for f in (FIXTURES / family).glob("model*.safetensors"):
        original.update(load_file(str(f)))
    exported = {}
    for f in out.glob("model*.safetensors"):
        exported.update(load_file(str(f)))  # readable by the reference safetensors library
    tied = model.config.tie_embeddings
    assert set(exported) == set(original) - ({"lm_head.weight"} if tied else set())
    for name, value in exported.items():
        np.testing.assert_array_equal(value, original[name])
    if shard:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
    again = nnlib.load_hf_checkpoint(out)
    assert again.config == model.config


def test_export_writes_special_token_ids_generation_config_and_files(tmp_path):
    model = nnlib.load_hf_checkpoint(FIXTURES / "llama")
    out = nnlib.save_hf_checkpoint(
        model,
        tmp_path / "export",
        special_token_ids={"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None},
        generation_config={"eos_token_id": [7, 2], "temperature": 0.6},
        files={"tokenizer.json": "{}", "tokenizer.model": b"\x00\x01"},
    )
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert "pad_token_id" not in config  # None entries are left out
    generation = json.loads((out / "generation_config.json").read_text())
    # the given generation config's stop tokens win; the ids fill in what it lacks
    assert generation == {"eos_token_id": [7, 2], "temperature": 0.6, "bos_token_id": 1}
    assert (out / "tokenizer.json").read_text() == "{}"
    assert (out / "tokenizer.model").read_bytes() == b"\x00\x01"
    assert nnlib.load_hf_checkpoint(out).config == model.config
    plain = nnlib.save_hf_checkpoint(model, tmp_path / "plain")
    assert not (plain / "generation_config.json").exists()
    with pytest.raises(nnlib.Error, match="plain file name"):
        nnlib.save_hf_checkpoint(model, tmp_path / "bad", files={"../x": "y"})
    assert not (tmp_path / "bad").exists()


def test_mismatch_lists_missing_unexpected_and_mis_shaped(tmp_path):
    model = nnlib.load_hf_checkpoint(FIXTURES / "llama")
    out = nnlib.save_hf_checkpoint(model, tmp_path / "bad")
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.9.extra.weight"] = np.zeros(3, np.float32)
    tensors["model.norm.weight"] = np.zeros(5, np.float32)
    from safetensors.numpy import save_file

    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(nnlib.CheckpointMismatchError) as err:
        nnlib.load_hf_checkpoint(out)
    e = err.value
    assert e.missing == ["model.layers.1.mlp.up_proj.weight"]
    assert e.unexpected == ["model.layers.9.extra.weight"]
    assert e.mis_shaped == [("model.norm.weight", (5,), (16,))]
    assert "missing (1)" in str(e) and "unexpected (1)" in str(e) and "mis-shaped (1)" in str(e)


def test_bfloat16_checkpoint_loads(tmp_path):
    model = nnlib.load_hf_checkpoint(FIXTURES / "qwen3", param_dtype="bfloat16")
    out = nnlib.save_hf_checkpoint(model, tmp_path / "bf16")
    with safe_open(str(out / "model.safetensors"), "numpy") as f:  # the reference reader
        assert f.get_slice("model.norm.weight").get_dtype() == "BF16"
    again = nnlib.load_hf_checkpoint(out)
    assert again.config.param_dtype == "bfloat16"
    w = nnx.state(again, nnx.Param)["embed"][...]
    assert w.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(w), np.asarray(nnx.state(model, nnx.Param)["embed"][...])
    )
    assert jax.tree.leaves(nnx.state(again, nnx.Param))


@pytest.mark.parametrize("fixture", ["qwen3-sliding", "qwen3_moe-sliding"])
def test_qwen_sliding_window_logits_match_hf_transformers(fixture):
    # Ten tokens over a window of 4: every position past the window depends on the rule.
    tokens, positions, want = io(fixture)
    model = nnlib.load_hf_checkpoint(FIXTURES / fixture)
    assert model.config.sliding_window == 4
    got, _ = forward(model, tokens, positions)
    assert max_diff(got, want) <= 1e-4
