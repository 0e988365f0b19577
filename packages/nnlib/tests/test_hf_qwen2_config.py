"""A real Qwen2 config.json (Qwen/Qwen2.5-0.5B-Instruct's, verbatim in fixtures/hf), with and
without the `attention_bias` key that converters add: transformers' Qwen2 ignores that key (its
q/k/v projections always have a bias, o_proj never), so nnlib must load all three forms."""

import json
import pathlib
import shutil

import numpy as np
import pytest
from nnlib_testutil import forward, max_diff
from test_hf import FIXTURES, io

from jaxstack import nnlib

REAL = json.loads((FIXTURES / "qwen2.5-0.5b-instruct.config.json").read_text())
# The keys that size the model or set its numerics, taken from the transformers-made qwen2
# fixture so that its weights and logits apply; every other key of the real file stays.
FIXTURE_VALUES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "tie_word_embeddings",
)


@pytest.mark.parametrize("attention_bias", [None, True, False])
def test_the_real_config_reads_as_transformers_reads_it(attention_bias):
    d = dict(REAL) if attention_bias is None else dict(REAL, attention_bias=attention_bias)
    c = nnlib.ModelConfig.from_hf_config(d)
    assert (c.family, c.vocab_size, c.d_model, c.num_layers, c.mlp_dim) == (
        "qwen2",
        151936,
        896,
        24,
        4864,
    )
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (14, 2, 64)
    assert c.qkv_bias and not c.qk_norm and c.tie_embeddings
    assert c.rope_theta == 1e6 and c.rope_scaling is None and c.norm_eps == 1e-6
    # use_sliding_window=false: transformers drops the 32768 window of the file.
    assert c.sliding_window is None and set(c.layer_windows()) == {None}
    assert (c.activation, c.param_dtype, c.max_seq_len) == ("silu", "bfloat16", 32768)


def tiny_real_checkpoint(tmp_path: pathlib.Path, **extra) -> pathlib.Path:
    """The qwen2 fixture's weights under a config.json with the real file's key set."""
    fixture = json.loads((FIXTURES / "qwen2" / "config.json").read_text())
    config = dict(REAL, **{k: fixture[k] for k in FIXTURE_VALUES}, **extra)
    # The fixture was made with transformers 5's keys: RoPE base 10000 and float32 weights.
    config.update(rope_theta=fixture["rope_parameters"]["rope_theta"], torch_dtype="float32")
    folder = tmp_path / "qwen2.5-tiny"
    folder.mkdir()
    shutil.copy(FIXTURES / "qwen2" / "model.safetensors", folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.mark.parametrize("attention_bias", [True, False])
def test_attention_bias_key_loads_the_hf_logits(tmp_path, attention_bias):
    tokens, positions, want = io("qwen2")
    model = nnlib.load_hf_checkpoint(tiny_real_checkpoint(tmp_path, attention_bias=attention_bias))
    assert model.config.qkv_bias and model.config.param_dtype == "float32"
    assert max_diff(forward(model, tokens, positions)[0], want) <= 1e-5


def test_logits_match_transformers_on_the_real_key_set(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tiny_real_checkpoint(tmp_path, attention_bias=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    tokens, positions, _ = io("qwen2")
    with torch.no_grad():
        want = hf(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
    got, _ = forward(nnlib.load_hf_checkpoint(folder), tokens, positions)
    assert max_diff(got, want) <= 1e-5
