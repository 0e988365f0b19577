"""Loading from disk (HF folder, jaxstack-train run directory) and the jaxstack-serve process."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from jaxstack import ckptlib, datalib, nnlib
from jaxstack.serving import LLM, ConfigError, SamplingParams
from jaxstack.serving._src.llm import cli
from jaxstack.serving._src.llm.loading import load_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# A one-layer model: the server process compiles it from scratch.
RUN_MODEL = {
    "preset": "tiny",
    "d_model": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 16,
    "mlp_dim": 64,
    "max_seq_len": 128,
    "init_std": 0.1,
}
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"


def reference(model, ids: list[int], n: int = 8) -> list[int]:
    return nnlib.generate(model, np.array([ids]), n)[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as jaxstack-train leaves it: checkpoints/ with the run config."""
    root = tmp_path_factory.mktemp("run")
    fields = {k: v for k, v in RUN_MODEL.items() if k != "preset"}
    config = nnlib.get_preset("tiny").replace(vocab_size=259, **fields)
    model = nnlib.Transformer(config, rngs=nnx.Rngs(3))
    metadata = {"config": {"model": RUN_MODEL, "data": {"tokenizer": "byte", "seq_len": 64}}}
    with ckptlib.CheckpointManager(root / "checkpoints") as manager:
        manager.save(10, {"params": nnx.state(model, nnx.Param), "step": 10}, metadata=metadata)
    return root, model


def test_run_directory_serves_the_trained_params(run_dir):
    root, model = run_dir
    llm = LLM(root, max_num_seqs=4, max_num_batched_tokens=32)
    assert isinstance(llm.tokenizer, datalib.ByteTokenizer)
    out = llm.generate(["hello there"], GREEDY)[0]
    assert out.outputs[0].token_ids == reference(
        model, datalib.ByteTokenizer().encode("hello there")
    )


def test_quantised_directory_serves_the_quantised_model(run_dir, tmp_path):
    """A `jaxstack-quant ptq` output directory is served as it is: int8 weights stay int8."""
    quantlib = pytest.importorskip("jaxstack.quantlib", reason="the quant extra is not installed")
    _, model = run_dir
    rules = quantlib.PRESETS["int8"]
    qmodel = quantlib.quantize(model, quantlib.PtqProvider(rules))
    quantlib.save_quantized(
        qmodel, tmp_path / "int8", rules=rules, model_config=model.config,
        info={"tokenizer": "byte", "seq_len": 64},
    )  # fmt: skip
    llm = LLM(tmp_path / "int8", max_num_seqs=4, max_num_batched_tokens=32)
    ids = datalib.ByteTokenizer().encode("hello there")
    assert llm.generate(["hello there"], GREEDY)[0].outputs[0].token_ids == reference(qmodel, ids)
    stored = [
        v
        for v in jax.tree_util.tree_leaves((llm.engine.runner.params, llm.engine.runner.rest))
        if v.dtype == "int8"
    ]
    assert stored, "the served model holds no int8 weights"


def test_hf_folder_with_tokenizer_and_chat_template(tmp_path):
    texts = [f"sample text number {i} about jax and xla" for i in range(200)]
    tokenizer = datalib.BPETokenizer.train(texts, vocab_size=300)
    config = nnlib.get_preset("tiny-llama").replace(vocab_size=tokenizer.vocab_size, init_std=0.1)
    model = nnlib.Transformer(config, rngs=nnx.Rngs(0))
    folder = nnlib.save_hf_checkpoint(model, tmp_path / "hf")
    tokenizer.save(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "eos_token": "<eos>", "bos_token": "<bos>"})
    )
    llm = LLM(folder, max_num_seqs=4, max_num_batched_tokens=32)
    ids = tokenizer.encode("sample text about jax")
    assert llm.generate([ids], GREEDY)[0].outputs[0].token_ids == reference(model, ids)
    rendered = llm.chat_template.render([{"role": "user", "content": "hi"}])
    assert rendered == "[user] hi\n[assistant]"


def test_an_hf_folders_chat_template_is_its_own_or_the_one_given(tmp_path):
    config = nnlib.get_preset("tiny-llama").replace(vocab_size=259)
    folder = nnlib.save_hf_checkpoint(nnlib.Transformer(config, rngs=nnx.Rngs(0)), tmp_path / "hf")
    # No template anywhere: none is guessed (chat requests are refused, naming --chat-template).
    assert load_model(folder).chat_template is None
    config = {"chat_template": "old", "bos_token": {"content": "<s>"}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(TEMPLATE)  # transformers >= 4.43 reads it first
    hi = [{"role": "user", "content": "hi"}]
    assert load_model(folder).chat_template.render(hi) == "[user] hi\n[assistant]"
    given = tmp_path / "given.jinja"
    given.write_text("{{ bos_token }}<{{ messages[0]['content'] }}>")
    # the given template replaces the folder's own; its special tokens still come from the folder
    assert load_model(folder, chat_template=given).chat_template.render(hi) == "<s><hi>"
    given.write_text("{% for %}")
    with pytest.raises(ConfigError, match=r"--chat-template .*given\.jinja: chat template line"):
        load_model(folder, chat_template=given)


def test_generation_config_end_tokens_stop_generation(tmp_path):
    config = nnlib.get_preset("tiny-llama").replace(vocab_size=259, init_std=0.1)
    folder = nnlib.save_hf_checkpoint(nnlib.Transformer(config, rngs=nnx.Rngs(0)), tmp_path / "hf")
    free = SamplingParams(temperature=0.0, max_tokens=8)
    ids = datalib.ByteTokenizer().encode("hello")
    plain = LLM(folder, max_num_seqs=2, max_num_batched_tokens=32).generate([ids], free)[0]
    tokens = plain.outputs[0].token_ids
    at = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, tokens[at]]}))
    llm = LLM(folder, max_num_seqs=2, max_num_batched_tokens=32)
    out = llm.generate([ids], free)[0].outputs[0]
    assert (out.token_ids, out.finish_reason) == (tokens[: at + 1], "stop")
    assert len(llm.generate([ids], free.replace(ignore_eos=True))[0].outputs[0].token_ids) == 8
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ConfigError, match="eos_token_id must be a token id"):
        LLM(folder)


def test_bad_model_path_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(ConfigError, match="neither an HF model"):
        LLM(tmp_path)
    assert cli.main(["--model", str(tmp_path / "missing"), "--host-allocator", "system"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such directory" in err


def test_sigterm_drains_an_in_flight_stream(run_dir):
    root, _ = run_dir
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxstack.serving._src.llm.cli",
            "--model",
            str(root),
            "--port",
            "0",
            "--no-warmup",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "32",
            "--host-allocator",
            "system",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        port = None
        for line in proc.stdout:
            if m := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
                break
        assert port is not None, "the server did not start"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        body = {
            "prompt": "drain me",
            "max_tokens": 60,
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        assert response.status == 200
        events = [response.readline()]  # the first token is out: the stream is in flight
        proc.send_signal(signal.SIGTERM)
        events += response.read().splitlines()
        data = [e[6:] for e in events if e.startswith(b"data: ")]
        assert data[-1] == b"[DONE]"
        assert json.loads(data[-2])["usage"]["completion_tokens"] == 60
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
