"""lm-eval's API models against the server, as a user evaluates a served model.

`local-completions` scores (context, continuation) pairs with echoed prompt log-probabilities;
they must equal the model's own log-softmax within 1e-4, through lm-eval's remote tokenizer
(the server's /tokenizer_info and /tokenize, which it finds by itself) and through the HF
tokenizer of the model folder. `local-chat-completions` generates through the chat template
and stops at `until`. Skips when lm-eval is absent.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import jax
import numpy as np
import pytest
import uvicorn
from flax import nnx

from jaxstack import datalib, nnlib
from jaxstack.serving import EngineConfig, LLMEngine
from jaxstack.serving._src.llm.async_engine import AsyncEngine
from jaxstack.serving._src.llm.loading import DEFAULT_CHAT_TEMPLATE, load_model
from jaxstack.serving._src.llm.openai_server import create_llm_app

pytest.importorskip("lm_eval", reason="lm-eval is not installed")
from lm_eval.api.instance import Instance
from lm_eval.models.api_models import JsonChatStr
from lm_eval.models.openai_completions import (
    LocalChatCompletion,
    LocalCompletionsAPI,
)

NAME = "tiny-served"
TEXTS = [
    f"question {i}: the cat sat on the mat and the dog ate {i % 7} bones. answer: yes"
    for i in range(300)
]
PAIRS = [
    ("question 3: the cat sat on the", " mat"),
    ("question 3: the cat sat on the", " dog"),
    ("the dog ate", " 5 bones. answer: yes"),
    ("answer:", " no"),
    ("question 12: the cat", " sat on the mat and the dog ate 5 bones."),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An HF model folder: a tiny Llama, a BPE tokenizer with an end token, ChatML."""
    tokenizer = datalib.BPETokenizer.train(TEXTS, vocab_size=320)
    backend = tokenizer.backend
    backend.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    config = nnlib.get_preset("tiny-llama").replace(
        vocab_size=backend.get_vocab_size(), init_std=0.1, max_seq_len=256
    )
    model = nnlib.Transformer(config, rngs=nnx.Rngs(0))
    path = nnlib.save_hf_checkpoint(model, tmp_path_factory.mktemp("lm_eval") / NAME)
    backend.save(str(path / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "chat_template": DEFAULT_CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return path


@pytest.fixture(scope="module")
def server(folder):
    """The folder served over real HTTP on a free loopback port."""
    loaded = load_model(folder)
    engine = LLMEngine(
        loaded.model, loaded.tokenizer, EngineConfig(max_num_seqs=8, max_num_batched_tokens=128)
    )
    app = create_llm_app(
        AsyncEngine(engine),
        model_name=NAME,
        tokenizer=loaded.tokenizer,
        chat_template=loaded.chat_template,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", loaded
    server.should_exit = True
    thread.join(60)


def own_loglikelihood(model, context: list[int], continuation: list[int]):
    """The model's log-probability of `continuation` after `context`, and whether greedy
    decoding would produce it."""
    ids = np.array([context + continuation])
    apply, params = nnlib.as_function(model)
    logits, _ = jax.jit(apply)(params, ids, np.arange(ids.shape[1])[None])
    logp = np.asarray(jax.nn.log_softmax(logits[0].astype(np.float32), axis=-1))
    rows = np.arange(len(context) - 1, ids.shape[1] - 1)
    return float(logp[rows, continuation].sum()), bool(
        (logp[rows].argmax(-1) == continuation).all()
    )


@pytest.mark.parametrize("tokenizer_backend", ["auto", "huggingface"])
def test_local_completions_loglikelihoods_equal_the_models_own(server, folder, tokenizer_backend):
    url, loaded = server
    options = {}
    if tokenizer_backend == "huggingface":
        pytest.importorskip("transformers", reason="transformers is not installed")
        options["tokenizer"] = str(folder)
    lm = LocalCompletionsAPI(
        base_url=f"{url}/v1/completions",
        model=NAME,
        tokenizer_backend=tokenizer_backend,
        max_length=256,
        **options,
    )
    if tokenizer_backend == "auto":  # found the server's /tokenizer_info and /tokenize
        assert type(lm.tokenizer).__name__ == "RemoteTokenizer"
    requests = [
        Instance("loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(PAIRS)
    ]
    scores = lm.loglikelihood(requests, disable_tqdm=True)
    expected = [own_loglikelihood(loaded.model, *lm._encode_pair(*pair)) for pair in PAIRS]
    for (got, got_greedy), (want, want_greedy) in zip(scores, expected, strict=True):
        assert abs(got - want) < 1e-4
        assert got_greedy == want_greedy
    assert len({round(s, 3) for s, _ in scores}) == len(PAIRS)  # real, distinct scores


def test_local_chat_completions_generate_until(server):
    url, loaded = server
    lm = LocalChatCompletion(base_url=f"{url}/v1/chat/completions", model=NAME)
    messages = [{"role": "user", "content": "question 5: the cat sat on the"}]
    until = " the"
    requests = [
        Instance(
            "generate_until",
            doc={},
            arguments=(JsonChatStr(json.dumps(messages)), {"until": [until], "max_gen_toks": 12}),
            idx=0,
        )
    ]
    [text] = lm.generate_until(requests, disable_tqdm=True)
    # The model's own greedy continuation of the rendered chat, cut where lm-eval asked.
    prompt = loaded.tokenizer.backend.encode(
        loaded.chat_template.render(messages, add_generation_prompt=True),
        add_special_tokens=False,
    ).ids
    ids = nnlib.generate(loaded.model, np.array([prompt]), 12)[0, len(prompt) :].tolist()
    if loaded.tokenizer.eos_id in ids:
        ids = ids[: ids.index(loaded.tokenizer.eos_id)]
    expected = loaded.tokenizer.decode(ids).split(until)[0]
    assert text == expected
