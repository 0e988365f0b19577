"""A user's HF folder in, a complete HF folder out: tokenizer, ids, chat template, PEFT adapter."""

import json

import numpy as np
import pytest
import tokenizers
from safetensors.numpy import load_file

from jaxstack import datalib, rl, serving
from jaxstack.rl._src.policy import build_policy

CHATS = [
    {
        "messages": [
            {"role": "user", "content": f"echo {i}"},
            {"role": "assistant", "content": str(i)},
        ]
    }
    for i in range(12)
]


def run_sft(tmp_path, tiny, data, *overrides, name="run"):
    config = rl.load_config(
        "sft",
        None,
        [
            *tiny,
            f"data.path={data}",
            "data.seq_len=48",
            "data.batch_size=4",
            "train.steps=2",
            "optim.lr=1e-2",
            f"log.run_dir={tmp_path / name}",
            *overrides,
        ],
    )
    return rl.sft(config)


def test_init_hf_takes_the_folders_tokenizer_and_writes_a_complete_folder(
    tmp_path, tiny_hf, write_jsonl, hf_folder
):
    source = hf_folder()
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    result = run_sft(
        tmp_path,
        tiny_hf,
        data,
        f"init.hf={source}",
        "lora.rank=4",
        r"lora.pattern=attn/(q|v)_proj$",
    )
    assert result.step == 2
    out = result.run_dir / "model"
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= names
    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    # the source's tokenizer, byte for byte, and the ids it gives
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    eos, end_of_turn = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == eos and config["pad_token_id"] == eos
    assert "bos_token_id" not in config  # this vocabulary has none
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [end_of_turn, eos]  # the source's stop tokens
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    source_config = json.loads((source / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == source_config["chat_template"]
    assert "<|im_start|>" in tok_config["chat_template"]
    assert tok_config["eos_token"] == "<|endoftext|>"
    # the run read the folder's tokenizer (not the byte one)
    saved = rl.load_config("sft", str(result.run_dir / "config.yaml"))
    assert saved.base.data.tokenizer == str(source)
    # PEFT adapter: PEFT's file names, key names and [r, in] / [out, r] shapes
    adapter = result.run_dir / "adapter"
    adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    assert adapter_config["peft_type"] == "LORA" and adapter_config["task_type"] == "CAUSAL_LM"
    assert adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 4.0
    assert adapter_config["target_modules"] == ["q_proj", "v_proj"]
    assert adapter_config["base_model_name_or_path"] == str(source.resolve())
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    prefix = "base_model.model.model.layers.0.self_attn"
    assert sorted(tensors) == [
        f"{prefix}.{m}_proj.lora_{ab}.weight" for m in ("q", "v") for ab in ("A", "B")
    ]
    assert tensors[f"{prefix}.q_proj.lora_A.weight"].shape == (4, 32)
    assert tensors[f"{prefix}.q_proj.lora_B.weight"].shape == (32, 4)
    # merged weights = base + B @ A * alpha / r, in HF's [out, in] layout
    base = load_file(str(source / "model.safetensors"))
    merged = load_file(str(out / "model.safetensors"))
    for m in ("q", "v"):
        name = f"model.layers.0.self_attn.{m}_proj.weight"
        delta = (
            tensors[f"{prefix}.{m}_proj.lora_B.weight"]
            @ tensors[f"{prefix}.{m}_proj.lora_A.weight"]
        )
        assert np.abs(delta).max() > 0
        np.testing.assert_allclose(merged[name], base[name] + delta, atol=1e-6)
    np.testing.assert_array_equal(
        merged["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"]
    )
    # the folder is itself a valid init.hf, tokenizer included
    again = build_policy(rl.load_config("dpo", None, [*tiny_hf, f"init.hf={out}"]))
    assert again.tokenizer.eos_id == eos and again.tokenizer.vocab_size == tok.get_vocab_size()
    # the adapter serves over the base folder without merging, and answers as the merged folder
    greedy = serving.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    prompt = tok.encode("What is 2+2?").ids
    engine = dict(max_num_seqs=2, max_num_batched_tokens=32)
    [over_base] = serving.LLM(source, adapters={"sft": adapter}, **engine).generate(
        [prompt], greedy, adapter="sft"
    )
    [from_merged] = serving.LLM(out, **engine).generate([prompt], greedy)
    assert over_base.outputs[0].token_ids == from_merged.outputs[0].token_ids
    np.testing.assert_allclose(
        over_base.outputs[0].logprobs, from_merged.outputs[0].logprobs, atol=1e-4
    )


def test_every_preset_takes_an_init_hf_folders_own_tokenizer(hf_folder):
    import warnings

    source = hf_folder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the folder's tokenizer is used
        for preset in rl.list_presets():
            config = rl.load_config(None, preset, [f"init.hf={source}", "data.path=x.jsonl"])
            assert config.data.tokenizer == str(source), preset
    with pytest.warns(UserWarning, match=r"^data\.tokenizer='byte' replaces the tokenizer of "):
        rl.load_config("sft", "tiny-sft", [f"init.hf={source}", "data.tokenizer=byte"])


def test_an_init_hf_model_takes_the_compute_settings_and_refuses_the_architecture_ones(
    tmp_path, tiny_hf, write_jsonl, hf_folder
):
    source = hf_folder()
    compute = ["model.dtype=bfloat16", "model.remat=full"]
    # the preset's own model section (2 layers) is not used: the folder defines the model
    config = rl.load_config("sft", "tiny-sft", [*tiny_hf, f"init.hf={source}", *compute])
    policy = build_policy(config)
    assert (policy.model.config.dtype, policy.model.config.remat) == ("bfloat16", "full")
    assert policy.model.config.num_layers == 1
    for override in ("model.num_layers=3", "model.preset=tiny-llama", "model.d_model=128"):
        with pytest.raises(
            rl.ConfigError,
            match=rf"^{override.split('=')[0]} has no effect next to init\.hf='.*': the folder's "
            r"config\.json defines the model, and of the model section only dtype, param_dtype, "
            r"remat, moe_impl apply to it; remove the override$",
        ):
            rl.load_config("sft", "tiny-sft", [f"init.hf={source}", *compute, override])
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    result = run_sft(tmp_path, tiny_hf, data, f"init.hf={source}", *compute)
    assert np.isfinite(result.summary["final_loss"])
    config = json.loads((result.run_dir / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1


def test_byte_runs_write_a_tokenizer_json_with_the_byte_ids(tmp_path, tiny, write_jsonl):
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    result = run_sft(tmp_path, tiny, data)
    out = result.run_dir / "model"
    byte = datalib.ByteTokenizer()
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "héllo <|user|>\n2+2=4 ✓"
    assert tok.encode(text, add_special_tokens=False).ids == byte.encode(text)
    assert tok.decode(byte.encode(text)) == text
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    loaded = datalib.BPETokenizer.from_file(out)
    assert (loaded.bos_id, loaded.eos_id, loaded.pad_id) == (1, 2, 0)
    assert not (result.run_dir / "adapter").exists()  # full fine-tuning: no adapter


def test_a_tokenizer_that_does_not_fit_the_model_is_an_error_at_start(
    tmp_path, tiny, tiny_hf, write_jsonl, hf_folder
):
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    big = hf_folder("big", vocab_size=4096)
    with (
        pytest.raises(rl.ConfigError, match="not the model's tokenizer"),
        pytest.warns(UserWarning, match="replaces the tokenizer of init.hf"),
    ):
        run_sft(tmp_path, tiny_hf, data, f"init.hf={big}", "data.tokenizer=byte")
    small = hf_folder("small", vocab_size=200)
    with pytest.raises(rl.ConfigError, match="index past the embedding"):
        run_sft(tmp_path, tiny_hf, data, f"init.hf={small}")
    bare = hf_folder("bare")
    (bare / "tokenizer.json").unlink()
    with pytest.raises(rl.ConfigError, match=r"has no tokenizer\.json; set data\.tokenizer"):
        run_sft(tmp_path, tiny_hf, data, f"init.hf={bare}")
    assert not (tmp_path / "run").exists()  # refused before anything was written
    # a fresh model may have spare rows: its weights are nobody's yet
    fresh = build_policy(rl.load_config("sft", None, [*tiny, "model.vocab_size=4096"]))
    assert fresh.model.config.vocab_size == 4096


def _peers_python():
    """A Python with torch, transformers and peft: this one, or $JAXSTACK_PEERS_PYTHON."""
    import importlib.util
    import os
    import sys

    if all(importlib.util.find_spec(m) for m in ("torch", "transformers", "peft")):
        return sys.executable
    other = os.environ.get("JAXSTACK_PEERS_PYTHON")
    if not other:
        pytest.skip("needs torch, transformers and peft (or JAXSTACK_PEERS_PYTHON naming a Python)")
    return other


@pytest.mark.slow
def test_transformers_and_peft_load_the_folders_and_agree_with_jaxstack(
    tmp_path, tiny_hf, write_jsonl, hf_folder
):
    import pathlib
    import subprocess

    from jaxstack.serving import LLM, SamplingParams

    python = _peers_python()
    source = hf_folder()
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    result = run_sft(tmp_path, tiny_hf, data, f"init.hf={source}", "lora.rank=4", "optim.lr=1e-3")
    out = result.run_dir / "model"
    policy = build_policy(rl.load_config("sft", None, [*tiny_hf, f"init.hf={out}"]))
    messages = [{"role": "user", "content": "echo 3"}]
    prompt = [int(t) for t in policy.encoder().prompt(messages)]
    llm = LLM(str(out), max_num_seqs=2)  # the folder as jaxstack-serve loads it
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ours = llm.generate([prompt], greedy)
    ours = list(ours[0].outputs[0].token_ids)
    spec = {
        "model": str(out),
        "adapter": str(result.run_dir / "adapter"),
        "base": str(source),
        "messages": messages,
        "max_new_tokens": 12,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    script = pathlib.Path(__file__).parent / "scripts" / "hf_peers_check.py"
    proc = subprocess.run(
        [python, str(script), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    theirs = json.loads(line.removeprefix("RESULT "))
    assert theirs["prompt_ids"] == prompt  # transformers' chat template = ours
    assert len(ours) == 12 and len(set(ours)) > 1
    assert theirs["completion_ids"] == ours  # greedy generate agrees token for token
    # PEFT adapter on the base = merged weights, and the adapter moved the base
    assert theirs["peft_max_logit_diff"] < 1e-5 < theirs["base_max_logit_diff"]
    assert len(theirs["peft_lora_modules"]) == 7  # every default target of the one layer
