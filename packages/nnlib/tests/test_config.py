import json

import pytest

from jaxstack import nnlib


def test_tiny_preset_is_the_contract():
    c = nnlib.get_preset("tiny")
    assert (c.family, c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (
        "llama",
        256,
        4,
        4,
        4,
        64,
    )
    assert (c.mlp_dim, c.vocab_size, c.max_seq_len, c.activation) == (1024, 4096, 256, "silu")


def test_presets_listed_and_valid():
    names = nnlib.list_presets()
    for required in ("tiny", "tiny-moe", "llama3-8b", "qwen2-7b", "mixtral-8x7b"):
        assert required in names
    assert nnlib.get_preset("mixtral-8x7b").num_experts == 8
    assert nnlib.get_preset("qwen2-7b").qkv_bias
    with pytest.raises(nnlib.ConfigError, match="unknown preset 'nope'"):
        nnlib.get_preset("nope")


@pytest.mark.parametrize("name", ["tiny", "tiny-gemma2", "llama3.1-8b", "tiny-moe"])
def test_dict_round_trip_through_json(name):
    c = nnlib.get_preset(name)
    again = nnlib.ModelConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c and hash(again) == hash(c)


def test_replace_and_validation_errors():
    c = nnlib.get_preset("tiny")
    assert c.replace(num_layers=2).num_layers == 2
    with pytest.raises(nnlib.ConfigError, match="num_heads=4 is not a multiple of num_kv_heads=3"):
        c.replace(num_kv_heads=3)
    with pytest.raises(nnlib.ConfigError, match="remat='some'"):
        c.replace(remat="some")
    with pytest.raises(nnlib.ConfigError, match="no field"):
        c.replace(d_modle=3)
    with pytest.raises(nnlib.ConfigError, match="unknown ModelConfig field"):
        nnlib.ModelConfig.from_dict({"bogus": 1})


def test_hf_config_round_trip_for_every_family():
    for name in (
        "tiny-llama",
        "tiny-mistral",
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-gemma",
        "tiny-gemma2",
        "tiny-mixtral",
    ):
        c = nnlib.get_preset(name)
        assert nnlib.ModelConfig.from_hf_config(c.to_hf_config()) == c, name


def test_hf_config_errors_name_the_problem():
    with pytest.raises(nnlib.ConfigError, match="model_type='bert'"):
        nnlib.ModelConfig.from_hf_config({"model_type": "bert"})
    d = nnlib.get_preset("tiny-llama").to_hf_config()
    d["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(nnlib.ConfigError, match="'yarn'"):
        nnlib.ModelConfig.from_hf_config(d)


def test_from_hf_config_reads_transformers5_rope_parameters():
    d = nnlib.get_preset("tiny-llama").to_hf_config()
    scaling = d.pop("rope_scaling")
    d["rope_parameters"] = {**scaling, "rope_theta": d.pop("rope_theta")}
    c = nnlib.ModelConfig.from_hf_config(d)
    assert c.rope_theta == 500000.0 and c.rope_scaling["rope_type"] == "llama3"
