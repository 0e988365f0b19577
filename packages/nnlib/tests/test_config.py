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


def test_qwen3_sliding_window_layers_follow_max_window_layers():
    # A transformers 4.x config.json: no layer_types, the rule is max_window_layers.
    d = nnlib.get_preset("tiny-qwen3").replace(num_layers=3).to_hf_config()
    d.update(use_sliding_window=True, sliding_window=16, max_window_layers=1)
    c = nnlib.ModelConfig.from_hf_config(d)
    assert c.layer_windows() == (None, 16, 16)
    assert nnlib.ModelConfig.from_hf_config(c.to_hf_config()) == c
    d["use_sliding_window"] = False  # Qwen then ignores sliding_window
    assert nnlib.ModelConfig.from_hf_config(d).layer_windows() == (None, None, None)


def test_qwen3_moe_sliding_window_applies_to_every_layer():
    d = nnlib.get_preset("tiny-qwen3").to_hf_config()
    d.update(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, use_sliding_window=True, sliding_window=16,
             max_window_layers=1)  # fmt: skip
    c = nnlib.ModelConfig.from_hf_config(d)
    assert set(c.layer_windows()) == {16}
    assert nnlib.ModelConfig.from_hf_config(c.to_hf_config()) == c


def test_hf_attention_bias_means_an_o_proj_bias_too():
    d = nnlib.get_preset("tiny-llama").to_hf_config()
    d["attention_bias"] = True
    with pytest.raises(nnlib.ConfigError, match=r"attention_bias=true.*o_proj"):
        nnlib.ModelConfig.from_hf_config(d)


def test_hf_export_writes_qkv_bias_only_where_the_family_has_it():
    qwen2 = nnlib.get_preset("tiny-qwen2").to_hf_config()
    assert qwen2["model_type"] == "qwen2" and "attention_bias" not in qwen2
    assert nnlib.get_preset("tiny-llama").to_hf_config()["attention_bias"] is False
    with pytest.raises(nnlib.ConfigError, match=r"qkv_bias=True.*qwen2"):
        nnlib.get_preset("tiny-llama").replace(qkv_bias=True).to_hf_config()
    with pytest.raises(nnlib.ConfigError, match=r"qwen2.*qkv_bias=False"):
        nnlib.get_preset("tiny-qwen2").replace(qkv_bias=False).to_hf_config()


@pytest.mark.parametrize("family", ["qwen2", "mistral", "mixtral"])
def test_bias_keys_that_transformers_ignores_load(family):
    """qwen2 hard-codes q/k/v biases, mistral and mixtral no biases: the keys change nothing."""
    d = nnlib.get_preset(f"tiny-{family}").to_hf_config()
    want = nnlib.ModelConfig.from_hf_config(d)
    assert nnlib.ModelConfig.from_hf_config(dict(d, attention_bias=True, mlp_bias=True)) == want
    assert want.qkv_bias == (family == "qwen2")


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma", "gemma2"])
def test_attention_bias_is_refused_in_one_sentence_where_it_adds_an_o_proj_bias(family):
    d = dict(nnlib.get_preset(f"tiny-{family}").to_hf_config(), attention_bias=True)
    with pytest.raises(nnlib.ConfigError) as info:
        nnlib.ModelConfig.from_hf_config(d)
    message = str(info.value)
    assert message.count(". ") == 0 and f"attention_bias=true ({family})" in message
    assert "o_proj bias" in message and "qwen2" not in message


def test_missing_keys_take_the_defaults_of_transformers_config_class():
    mistral = nnlib.get_preset("tiny-mistral").to_hf_config()
    for key in ("sliding_window", "num_key_value_heads"):
        del mistral[key]
    c = nnlib.ModelConfig.from_hf_config(dict(mistral, num_attention_heads=16))
    assert (c.sliding_window, c.num_kv_heads) == (4096, 8)  # MistralConfig's defaults

    mixtral = nnlib.get_preset("tiny-mixtral").to_hf_config()
    for key in ("rope_theta", "rms_norm_eps", "num_local_experts"):
        del mixtral[key]
    c = nnlib.ModelConfig.from_hf_config(dict(mixtral, num_experts=4))  # attribute_map alias
    assert (c.rope_theta, c.norm_eps, c.num_experts) == (1e6, 1e-5, 4)

    gemma2 = nnlib.get_preset("tiny-gemma2").to_hf_config()
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
        del gemma2[key]
    c = nnlib.ModelConfig.from_hf_config(gemma2)
    assert (c.attn_logit_soft_cap, c.final_logit_soft_cap, c.query_pre_attn_scalar) == (
        50.0,
        30.0,
        256,
    )


def test_export_writes_a_null_window_where_a_missing_key_would_mean_one():
    c = nnlib.get_preset("tiny-mistral").replace(sliding_window=None)
    d = c.to_hf_config()
    assert d["sliding_window"] is None
    assert nnlib.ModelConfig.from_hf_config(d) == c


@pytest.mark.parametrize(
    "extra,match",
    [
        ({"use_bidirectional_attention": True}, r"use_bidirectional_attention=true \(gemma\)"),
        ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5 rotates only part"),
    ],
)
def test_settings_nnlib_cannot_run_are_refused(extra, match):
    d = dict(nnlib.get_preset("tiny-gemma").to_hf_config(), **extra)
    with pytest.raises(nnlib.ConfigError, match=match):
        nnlib.ModelConfig.from_hf_config(d)


def test_a_config_without_the_model_sizes_names_them():
    d = nnlib.get_preset("tiny-llama").to_hf_config()
    del d["hidden_size"], d["intermediate_size"]
    with pytest.raises(nnlib.ConfigError, match=r"lacks \['hidden_size', 'intermediate_size'\]"):
        nnlib.ModelConfig.from_hf_config(d)
