"""SFT end to end: assistant-only loss mask, and with LoRA only the adapted weights move."""

import re

import jax
import numpy as np
import pytest
from flax import nnx

from jaxstack import datalib, nnlib, rl
from jaxstack.rl._src.encode import Encoder, build_chat_template
from jaxstack.rl._src.records import SftRecord


def sft_config(tmp_path, tiny, data, *overrides):
    """A tiny SFT run on `data` in tmp_path/run: rows of 32 tokens, batches of 4."""
    return rl.load_config(
        "sft",
        None,
        [
            *tiny,
            f"data.path={data}",
            "data.seq_len=32",
            "data.batch_size=4",
            f"log.run_dir={tmp_path / 'run'}",
            *overrides,
        ],
    )


def test_chat_documents_learn_only_the_assistant_reply_and_eos():
    tok = datalib.ByteTokenizer()
    encoder = Encoder(tok, build_chat_template(None))
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    doc = encoder.sft_document(SftRecord(messages=messages))
    learned = [int(t) for t, m in zip(doc["tokens"], doc["loss_mask"], strict=True) if m]
    assert tok.decode(learned[:-1]) == "4\n"  # the reply and the template's end of turn
    assert learned[-1] == tok.eos_id
    assert doc["tokens"][0] == tok.bos_id and doc["loss_mask"][0] == 0
    prompt_doc = encoder.sft_document(SftRecord(prompt="1+1=", completion="2"))
    learned = [
        int(t) for t, m in zip(prompt_doc["tokens"], prompt_doc["loss_mask"], strict=True) if m
    ]
    assert learned == [*tok.encode("2"), tok.eos_id]


def test_lora_sft_changes_only_the_adapted_kernels(tmp_path, tiny, tiny_model_config, write_jsonl):
    chats = [
        {
            "messages": [
                {"role": "user", "content": f"echo {i}"},
                {"role": "assistant", "content": str(i)},
            ]
        }
        for i in range(20)
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", chats)
    pattern = r"attn/(q|v)_proj$"
    config = sft_config(
        tmp_path,
        tiny,
        path,
        "train.steps=3",
        "optim.lr=1e-2",
        "lora.rank=4",
        f"lora.pattern={pattern}",
    )
    result = rl.sft(config)
    assert result.step == 3
    base = nnlib.Transformer(
        tiny_model_config.replace(vocab_size=259), rngs=nnx.Rngs(config.base.train.seed)
    )
    tuned = nnlib.load_hf_checkpoint(tmp_path / "run" / "model")
    flat = lambda m: {
        jax.tree_util.keystr(k, simple=True, separator="/"): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(nnx.state(m, nnx.Param))
    }
    before, after = flat(base), flat(tuned)
    assert before.keys() == after.keys()
    adapted = {p for p in before if re.search(r"attn/(q|v)_proj/kernel", p)}
    assert len(adapted) == 2
    for path_, value in before.items():
        if path_ in adapted:
            assert not np.allclose(value, after[path_]), path_
        else:
            np.testing.assert_array_equal(value, after[path_], err_msg=path_)
    # the checkpointed trainable state is the adapters alone
    from jaxstack import ckptlib

    with ckptlib.CheckpointManager(tmp_path / "run" / "checkpoints", read_only=True) as m:
        leaves = m.restore().state["params"]
    names = [
        jax.tree_util.keystr(k, simple=True, separator="/")
        for k, _ in jax.tree_util.tree_leaves_with_path(leaves)
    ]
    assert names and all("/lora/" in n for n in names)


def test_qlora_sft_trains_adapters_over_an_nf4_base(tmp_path, tiny, write_jsonl):
    records = [{"prompt": f"{i}+1=", "completion": str(i + 1)} for i in range(20)]
    path = write_jsonl(tmp_path / "pc.jsonl", records)
    config = sft_config(
        tmp_path,
        tiny,
        path,
        "train.steps=4",
        "optim.lr=3e-2",
        "lora.rank=4",
        "lora.quantize=nf4",
        "lora.quantize_tile=16",
    )
    result = rl.sft(config)
    assert result.summary["final_loss"] < result.summary["first_loss"]
    adapters = tmp_path / "run" / "adapters.safetensors"
    assert adapters.is_file() and not (tmp_path / "run" / "model").exists()
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()  # PEFT's too
    with pytest.raises(rl.ConfigError, match="QLoRA"):
        rl.load_config("grpo", None, ["lora.rank=4", "lora.quantize=nf4"])


def test_sft_evaluates_the_current_params_and_stops_when_told(tmp_path, tiny, write_jsonl):
    from jaxstack import ckptlib
    from jaxstack.serving import LLM, SamplingParams

    records = [{"prompt": f"echo {i}=", "completion": str(i)} for i in range(20)]
    path = write_jsonl(tmp_path / "echo.jsonl", records)
    config = sft_config(tmp_path, tiny, path, "train.steps=12", "eval.every=4", "optim.lr=1e-2")
    seen = {}

    def evaluate(step, generate):
        seen[step] = generate(["echo 3=", "echo 7="])
        return {"score": step / 100}

    result = rl.sft(
        config,
        evaluate=evaluate,
        stop=lambda step, metrics: metrics.get("score", 0.0) >= 0.08,
        max_new_tokens=4,
    )
    assert result.step == 8 and sorted(seen) == [4, 8]
    assert ckptlib.CheckpointManager(tmp_path / "run" / "checkpoints").latest_step() == 8
    # what the evaluation generated at the stop is the exported model's greedy output
    tok = datalib.ByteTokenizer()
    encoder = Encoder(tok, build_chat_template(None))
    llm = LLM(str(tmp_path / "run" / "model"), tok, max_num_seqs=4)
    outputs = llm.generate(
        [[int(t) for t in encoder.prompt(p)] for p in ["echo 3=", "echo 7="]],
        SamplingParams(temperature=0.0, max_tokens=4),
    )
    assert seen[8] == [o.outputs[0].text for o in outputs]
