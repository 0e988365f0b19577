"""The OpenAI-compatible server, driven by the official `openai` client over real HTTP."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
import time

import jax
import numpy as np
import openai
import pytest
import uvicorn
from flax import nnx

from jaxstack import datalib, nnlib
from jaxstack.serving import LLM, EngineConfig, LLMEngine, SamplingParams
from jaxstack.serving._src.llm.async_engine import AsyncEngine, RequestFailedError
from jaxstack.serving._src.llm.loading import DEFAULT_CHAT_TEMPLATE
from jaxstack.serving._src.llm.openai_server import create_llm_app

TOKENIZER = datalib.ByteTokenizer()
KEY = "sk-test"
MODEL = "tiny"


class Server:
    """An AsyncEngine + the OpenAI app under uvicorn on a free loopback port."""

    def __init__(
        self, config, adapters=None, chat_template=DEFAULT_CHAT_TEMPLATE, **engine_options
    ):
        self.model = nnlib.Transformer(config, rngs=nnx.Rngs(0))
        config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, **engine_options)
        engine = LLMEngine(self.model, TOKENIZER, config, adapters=adapters)
        self.engine = AsyncEngine(engine, max_waiting=64)
        app = create_llm_app(
            self.engine,
            model_name=MODEL,
            tokenizer=TOKENIZER,
            chat_template=datalib.ChatTemplate(chat_template),
            api_key=KEY,
            max_request_bytes=4096,
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [sock]})
        self.thread.start()
        while not self.uvicorn.started:
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0, **kw)

    def request(self, method: str, path: str, body=None, headers=None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
        conn.request(
            method, path, body=data, headers={"Authorization": f"Bearer {KEY}", **(headers or {})}
        )
        response = conn.getresponse()
        raw = response.read()
        conn.close()
        ctype = response.getheader("Content-Type", "")
        return response.status, json.loads(raw) if "json" in ctype else raw.decode()

    def metric(self, name: str, labels: str = "") -> float:
        _, text = self.request("GET", "/metrics")
        m = re.search(rf"^jaxstack_llm_{name}{re.escape(labels)} (\S+)$", text, re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def close(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(60)


@pytest.fixture(scope="module")
def server(tiny_lm_config):
    s = Server(tiny_lm_config)
    yield s
    s.close()


def greedy(**kw):
    return dict(temperature=0.0, extra_body={"ignore_eos": True}, **kw)


def test_completions_match_the_offline_engine(server):
    client = server.client()
    out = client.completions.create(
        model=MODEL, prompt=["hello", "world!"], max_tokens=8, **greedy()
    )
    ids = [TOKENIZER.encode(p) for p in ("hello", "world!")]
    expected = [nnlib.generate(server.model, np.array([i]), 8)[0, len(i) :].tolist() for i in ids]
    assert [c.text for c in out.choices] == [TOKENIZER.decode(e) for e in expected]
    assert [c.finish_reason for c in out.choices] == ["length", "length"]
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (11, 16)


def test_streamed_completion_equals_the_unstreamed_one_and_reports_usage(server):
    client = server.client()
    full = client.completions.create(model=MODEL, prompt="stream me", max_tokens=10, **greedy())
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="stream me",
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
            **greedy(),
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def merged_stream(server, path: str, body: dict) -> dict[int, dict]:
    """The streamed answer's chunks joined per choice index, in the unstreamed shape."""
    code, text = server.request("POST", path, {**body, "stream": True})
    assert code == 200, text
    merged: dict[int, dict] = {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        for c in json.loads(line[6:])["choices"]:
            into = merged.setdefault(c["index"], {"text": "", "logprobs": None})
            piece = c.get("delta", c)
            into["text"] += piece.get("text", piece.get("content")) or ""
            if c["logprobs"]:
                lp = into["logprobs"] or {key: [] for key in c["logprobs"]}
                into["logprobs"] = {key: lp[key] + value for key, value in c["logprobs"].items()}
            if c["finish_reason"]:
                into["finish_reason"] = c["finish_reason"]
    return merged


def same(a, b) -> bool:
    """Equal, log-probabilities within 1e-5: the second request of a pair reuses the first's
    cached prefix, so its prompt runs in a smaller step whose float sums round differently."""
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= 1e-5
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


SAMPLING_MODES = [
    {"temperature": 0},
    {"temperature": 1.0, "seed": 4, "n": 2, "top_p": 0.9, "top_k": 50},
    {"temperature": 0.7, "seed": 1, "presence_penalty": 1.0, "logit_bias": {"110": 5}},
    {"temperature": 0, "stop": ["e"], "min_tokens": 2},
    {"temperature": 1.0, "seed": 2, "guided_regex": "[a-z]{4}"},
]


@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_streaming_equals_not_streaming_field_by_field(server, mode):
    completion = {"prompt": "abc", "max_tokens": 8, "logprobs": 2, **mode}
    for body in (completion, {**completion, "echo": True}):
        code, full = server.request("POST", "/v1/completions", body)
        assert code == 200, full
        merged = merged_stream(server, "/v1/completions", body)
        for choice in full["choices"]:
            got = merged[choice["index"]]
            assert (got["text"], got["finish_reason"]) == (choice["text"], choice["finish_reason"])
            assert same(got["logprobs"], choice["logprobs"])
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **mode}
    chat |= {"logprobs": True, "top_logprobs": 2}
    code, full = server.request("POST", "/v1/chat/completions", chat)
    assert code == 200, full
    merged = merged_stream(server, "/v1/chat/completions", chat)
    for choice in full["choices"]:
        got = merged[choice["index"]]
        assert got["text"] == choice["message"]["content"]
        assert got["finish_reason"] == choice["finish_reason"]
        assert same(got["logprobs"], choice["logprobs"])


def test_n_samples_and_logprobs(server):
    client = server.client()
    out = client.completions.create(
        model=MODEL,
        prompt="abc",
        max_tokens=6,
        n=3,
        seed=5,
        temperature=1.0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.text for c in out.choices}) == 3
    for c in out.choices:
        assert len(c.logprobs.token_logprobs) == 6 and len(c.logprobs.top_logprobs) == 6
        assert all(
            len(top) <= 2 and lp <= 0
            for top, lp in zip(c.logprobs.top_logprobs, c.logprobs.token_logprobs, strict=True)
        )


def test_echo_with_zero_max_tokens_scores_the_prompt(server):
    client = server.client()
    prompt = "the cat sat on the mat"
    out = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0.0
    )
    lp = out.choices[0].logprobs
    ids = TOKENIZER.encode(prompt)
    apply, params = nnlib.as_function(server.model)
    logits, _ = jax.jit(apply)(params, np.array([ids]), np.arange(len(ids))[None])
    ref = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
    assert out.choices[0].text == prompt and lp.tokens == list(prompt)
    assert lp.token_logprobs[0] is None
    np.testing.assert_allclose(
        lp.token_logprobs[1:], ref[np.arange(len(ids) - 1), ids[1:]], atol=2e-4
    )


def test_chat_streaming_and_not(server):
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    full = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, logprobs=True, top_logprobs=2, **greedy()
    )
    prompt = TOKENIZER.encode(
        datalib.ChatTemplate(DEFAULT_CHAT_TEMPLATE).render(messages, add_generation_prompt=True)
    )
    expected = nnlib.generate(server.model, np.array([prompt]), 8)[0, len(prompt) :].tolist()
    assert full.choices[0].message.content == TOKENIZER.decode(expected)
    assert full.choices[0].message.role == "assistant"
    assert len(full.choices[0].logprobs.content) == 8
    assert full.usage.prompt_tokens == len(prompt)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        **greedy(),
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 8


def test_64_concurrent_streams_complete_and_free_every_block(server):
    async def one(client, i: int) -> tuple[int, int]:
        stream = await client.completions.create(
            model=MODEL,
            prompt=f"request number {i}: ",
            max_tokens=4 + i % 13,
            stream=True,
            stream_options={"include_usage": True},
            **greedy(),
        )
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens, 4 + i % 13

    async def all_of_them():
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=600
        )
        return await asyncio.gather(*(one(client, i) for i in range(64)))

    results = asyncio.run(all_of_them())
    assert [got for got, _ in results] == [want for _, want in results]
    assert server.metric("kv_blocks_used") == 0
    assert server.metric("num_requests_running") == 0


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server):
    aborted = server.metric("request_success_total", '{finish_reason="abort"}')
    stream = server.client().completions.create(
        model=MODEL, prompt="long story", max_tokens=140, stream=True, **greedy()
    )
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    deadline = time.time() + 60
    while server.metric("kv_blocks_used") and time.time() < deadline:
        time.sleep(0.05)
    assert server.metric("kv_blocks_used") == 0
    assert server.metric("request_success_total", '{finish_reason="abort"}') == aborted + 1


def test_shared_system_prompt_hits_the_prefix_cache(server):
    client = server.client()
    system = {"role": "system", "content": "You are a terse assistant who answers in one line."}
    template = datalib.ChatTemplate(DEFAULT_CHAT_TEMPLATE)
    rendered = [
        template.render([system, {"role": "user", "content": q}], add_generation_prompt=True)
        for q in ("What is JAX?", "Who made XLA?")
    ]
    shared = next(i for i, (a, b) in enumerate(zip(*rendered, strict=False)) if a != b)
    hits = []
    for question in ("What is JAX?", "Who made XLA?"):
        messages = [system, {"role": "user", "content": question}]
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **greedy())
        hits.append(server.metric("prefix_cache_hits_total"))
    # The second request reuses every full 16-token block of the shared rendered prefix.
    assert hits[1] - hits[0] == shared // 16 * 16 > 0
    assert server.metric("prefix_cache_hit_rate") > 0


def test_models_tokenize_detokenize_health(server):
    assert [m.id for m in server.client().models.list().data] == [MODEL]
    status, doc = server.request("POST", "/tokenize", {"prompt": "héllo"})
    assert status == 200 and doc["tokens"] == TOKENIZER.encode("héllo") and doc["count"] == 6
    status, doc = server.request("POST", "/detokenize", {"tokens": doc["tokens"]})
    assert (status, doc["prompt"]) == (200, "héllo")
    # vLLM's return_token_strs: each token's own text (a byte token's text when it has one)
    status, doc = server.request("POST", "/tokenize", {"prompt": "hé", "return_token_strs": True})
    assert status == 200 and doc["token_strs"] == ["h", "\ufffd", "\ufffd"]
    status, doc = server.request("POST", "/tokenize", {"prompt": "hé"})
    assert "token_strs" not in doc
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    # vLLM's /tokenizer_info, which lm-eval reads to tokenize through the server
    status, doc = server.request("GET", "/tokenizer_info")
    assert status == 200 and doc["chat_template"] == DEFAULT_CHAT_TEMPLATE
    assert doc["tokenizer_class"] == "ByteTokenizer" and doc["model_max_length"] == 160
    assert doc["eos_token"] is None  # the byte tokenizer's ids 0-2 have no text


@pytest.mark.parametrize(
    ("body", "status", "param", "needle"),
    [
        ({"model": "gpt-4", "prompt": "x"}, 404, "model", "not served"),
        ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", "valid integer"),
        ({"prompt": "x", "max_tokens": True}, 400, "max_tokens", "valid integer"),
        ({"prompt": "x", "max_tokens": 500}, 400, "max_tokens", "max_model_len"),
        ({"prompt": "y" * 200}, 400, "prompt", "shorten the prompt"),
        ({"prompt": "x", "temperature": -1}, 400, "temperature", "greater than or equal to 0"),
        ({"prompt": 3}, 400, "prompt", "'prompt' must be"),
        ({"prompt": ""}, 400, "prompt", "prompt is empty"),
        ({"prompt": [[1, 2], []]}, 400, "prompt", "'prompt' must be"),
        ({"prompt": [300]}, 400, "prompt", "[0, 259)"),
        ({"prompt": "x\ud800y"}, 400, "prompt", "lone surrogate \\ud800"),
        ({"prompt": ["ok", "\udfff"]}, 400, "prompt", "lone surrogate"),
        ({"prompt": "x", "stop": ["a", "\ud800"]}, 400, "stop", "lone surrogate"),
        ({"prompt": "x", "seed": 2**64}, 400, "seed", "less than 18446744073709551616"),
        ({"prompt": "x", "seed": 1.5}, 400, "seed", "valid integer"),
        ({"prompt": "x", "n": 129}, 400, "n", "limit of 128 (--max-n)"),
        ({"prompt": "x", "n": 0}, 400, "n", "greater than or equal to 1"),
        ({"prompt": "x", "logprobs": 21}, 400, "logprobs", "limit of 20"),
        ({"prompt": "x", "top_p": 0}, 400, "top_p", "greater than 0"),
        ({"prompt": "x", "temperature": "NaN"}, 400, "temperature", "valid number"),
        ({"prompt": "x", "stop": ""}, 400, "stop", "non-empty string"),
        (
            {"prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "stream_options",
            "needs 'stream': true",
        ),
        (
            {"prompt": "x", "stream": True, "stream_options": {"x": 1}},
            400,
            "stream_options.x",
            "not a field",
        ),
        ({"prompt": "x", "suffix": "y"}, 400, "suffix", "not supported"),
        ({"prompt": "x", "n": 3, "best_of": 2}, 400, "best_of", "must be >= n=3"),
        ({"prompt": "x", "logit_bias": {"a": 1}}, 400, "logit_bias", "not a token id"),
        ({"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias", "[-100, 100]"),
        ({"prompt": "x", "logit_bias": {"999": 1}}, 400, "logit_bias", "token ids < 259"),
        ({"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens", "max_tokens"),
        ({"prompt": "x", "guided_regex": "("}, 400, "guided_regex", "is not valid"),
        ({"prompt": "x", "guided_choice": []}, 400, "guided_choice", "at least 1"),
        (
            {"prompt": "x", "guided_regex": "a", "guided_choice": ["b"]},
            400,
            "guided_choice",
            "send one of guided_regex and guided_choice",
        ),
        (
            {"prompt": "x", "response_format": {"type": "json_schema"}},
            400,
            "response_format",
            "'json_schema' goes with type 'json_schema'",
        ),
        ({"prompt": "x", "temprature": 0}, 400, "temprature", "not a field this server knows"),
    ],
)
def test_bad_completions_get_openai_errors(server, body, status, param, needle):
    code, doc = server.request("POST", "/v1/completions", body)
    assert (code, doc["error"]["param"]) == (status, param), doc
    assert doc["error"]["type"] == "invalid_request_error"
    assert needle in doc["error"]["message"]
    if status == 404:
        assert doc["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role", "required"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "must be"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]},
            "messages[0].content",
            "not a text part",
        ),
        (
            {"messages": [{"role": "user", "content": "\ud800"}]},
            "messages[0].content",
            "lone surrogate",
        ),
        (
            {"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]},
            "messages[0]",
            "lone surrogate",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
            "top_logprobs",
            "needs 'logprobs': true",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
            "tools[0].function",
            "is required",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"},
            "tool_choice",
            "needs 'tools'",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo", "not a field"),
        (
            {"messages": [{"role": "user", "content": "y" * 200}]},
            "messages",
            "shorten the messages",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True},
            "continue_final_message",
            "set 'add_generation_prompt': false",
        ),
    ],
)
def test_bad_chat_requests_get_openai_errors(server, body, param, needle):
    code, doc = server.request("POST", "/v1/chat/completions", body)
    assert (code, doc["error"]["param"]) == (400, param), doc
    assert needle in doc["error"]["message"]


def test_a_model_without_a_chat_template_refuses_chat_naming_the_flag(server):
    from fastapi.testclient import TestClient

    app = create_llm_app(server.engine, model_name=MODEL, tokenizer=TOKENIZER, chat_template=None)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    response = TestClient(app).post("/v1/chat/completions", json=body)
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (400, "messages")
    assert "--chat-template" in error["message"]


TOOLS_TEMPLATE = (  # ChatML with the tools' names up front (Hermes templates write their JSON)
    "{% for t in tools or [] %}{{ t['function']['name'] }} {% endfor %}"
    "{% for m in messages %}<|im_start|>"
    "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {"type": "function", "function": {"name": "wx"}}


def test_tools_reach_the_chat_template_and_a_plain_answer_stays_content(server):
    from fastapi.testclient import TestClient

    template = datalib.ChatTemplate(TOOLS_TEMPLATE)
    app = create_llm_app(
        server.engine, model_name=MODEL, tokenizer=TOKENIZER, chat_template=template
    )
    client = TestClient(app)
    messages = [{"role": "user", "content": "wx?"}]
    rendered = template.render(messages, add_generation_prompt=True, tools=[WEATHER])
    tokens = client.post("/tokenize", json={"messages": messages, "tools": [WEATHER]}).json()
    assert tokens["tokens"] == TOKENIZER.encode(rendered)
    body = {"messages": messages, "tools": [WEATHER], "max_tokens": 6, "temperature": 0}
    answer = client.post("/v1/chat/completions", json=body).json()
    assert answer["usage"]["prompt_tokens"] == tokens["count"]
    [choice] = answer["choices"]
    assert "tool_calls" not in choice["message"] and isinstance(choice["message"]["content"], str)
    streamed = client.post("/v1/chat/completions", json={**body, "stream": True}).text
    deltas = [json.loads(line[6:]) for line in streamed.splitlines() if line[6:].startswith("{")]
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in deltas if d["choices"])
    assert text == choice["message"]["content"]
    none = client.post("/v1/chat/completions", json={**body, "tool_choice": "none"}).json()
    assert none["usage"]["prompt_tokens"] < tokens["count"]  # "none": the model is not told
    # "required": the answer is a call of one of the tools, its arguments valid for its schema.
    code = {"type": "string", "pattern": "^[A-Z]{3}$"}
    weather = {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"code": code}, "required": ["code"],
        "additionalProperties": False}}  # fmt: skip
    forced = {
        **body, "tools": [WEATHER, {"type": "function", "function": weather | {"name": "wy"}}],
        "tool_choice": {"type": "function", "function": {"name": "wy"}}, "temperature": 1.0,
        "max_tokens": 80,
    }  # fmt: skip
    wy_only = {"tools": forced["tools"][1:], "tool_choice": "required"}
    for changes in ({}, wy_only):  # a named tool among two; "required" of the one tool
        answer = client.post("/v1/chat/completions", json={**forced, **changes})
        assert answer.status_code == 200, answer.text
        [choice] = answer.json()["choices"]
        assert choice["finish_reason"] == "tool_calls", choice
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "wy"
        assert re.fullmatch("[A-Z]{3}", json.loads(call["function"]["arguments"])["code"])
    unknown = {**forced, "tool_choice": {"type": "function", "function": {"name": "nope"}}}
    refused = client.post("/v1/chat/completions", json=unknown)
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "tool_choice")


def test_tools_for_a_template_that_cannot_show_them_are_refused(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    code, doc = server.request("POST", "/v1/chat/completions", body)
    assert (code, doc["error"]["param"]) == (400, "tools")
    assert "does not render tools" in doc["error"]["message"]


def test_tools_and_tool_calls_reach_the_template_as_transformers_would_see_them(server):
    # Tools keep the client's key order; a call's arguments sent back as JSON text (as OpenAI
    # clients do) reach the template as the object they hold (as in vLLM).
    from fastapi.testclient import TestClient

    template = datalib.ChatTemplate(
        "{% for t in tools %}{{ t | tojson }}{% endfor %}|{% for m in messages %}"
        "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}"
        "{% endfor %}"
    )
    app = create_llm_app(
        server.engine, model_name=MODEL, tokenizer=TOKENIZER, chat_template=template
    )
    tool = {"function": {"parameters": {"type": "object"}, "name": "wx"}, "type": "function"}
    call = {"id": "c1", "type": "function", "function": {"name": "wx", "arguments": '{"a": 1}'}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    response = TestClient(app).post("/tokenize", json={"messages": messages, "tools": [tool]})
    text = TOKENIZER.decode(response.json()["tokens"])
    assert text == json.dumps(tool) + "|" + '{"a": 1}'


def test_continue_final_message_ends_the_prompt_inside_the_last_message(server):
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "The answer is "},
    ]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    status, doc = server.request("POST", "/tokenize", body)
    assert status == 200
    text = TOKENIZER.decode(doc["tokens"])
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\nThe answer is "
    # and a chat completion goes on from there, as a completion of that text would
    extra = {"continue_final_message": True, "add_generation_prompt": False, "ignore_eos": True}
    chat = server.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0.0, extra_body=extra
    )
    completion = server.client().completions.create(
        model=MODEL, prompt=text, max_tokens=6, **greedy()
    )
    assert chat.choices[0].message.content == completion.choices[0].text


def test_structured_output_through_the_openai_client(server):
    client = server.client()
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "where?"}], response_format=fmt,
        max_tokens=60, temperature=1.0, seed=3,
    )  # fmt: skip
    assert list(json.loads(chat.choices[0].message.content)) == ["city"]
    assert chat.choices[0].finish_reason == "stop"
    choice = {"guided_choice": ["left", "right"]}
    texts = [
        client.completions.create(
            model=MODEL, prompt="go", max_tokens=10, temperature=1.0, seed=seed, extra_body=choice
        )
        .choices[0]
        .text
        for seed in range(4)
    ]
    assert set(texts) <= {"left", "right"}
    stream = client.completions.create(
        model=MODEL, prompt="go", max_tokens=10, temperature=1.0, seed=0, extra_body=choice,
        stream=True,
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in stream if c.choices) == texts[0]


def test_best_of_answers_the_most_likely_of_its_samples(server):
    client = server.client()
    sample = dict(model=MODEL, prompt="abc", max_tokens=6, temperature=1.0, seed=9)
    four = client.completions.create(**sample, n=4, logprobs=0).choices
    likelihood = [sum(c.logprobs.token_logprobs) for c in four]
    ranked = sorted(range(4), key=likelihood.__getitem__, reverse=True)
    best = client.completions.create(**sample, extra_body={"best_of": 4}).choices
    assert [c.text for c in best] == [four[ranked[0]].text]
    two = client.completions.create(**sample, n=2, extra_body={"best_of": 4}).choices
    assert [c.text for c in two] == [four[i].text for i in sorted(ranked[:2])]
    code, doc = server.request(
        "POST", "/v1/completions", {"prompt": "x", "best_of": 2, "stream": True}
    )
    assert (code, doc["error"]["param"]) == (400, "best_of")


def test_requests_that_used_to_stop_the_engine_are_answered(server):
    """Seeds anywhere in 64 bits and top_k beyond int32 once raised OverflowError on the
    engine thread (every later request got 503)."""
    client = server.client()
    for extra in ({"seed": -1}, {"seed": 2**63 - 1}, {"seed": 2**64 - 1}, {"top_k": 2**40}):
        out = client.completions.create(
            model=MODEL, prompt="abc", max_tokens=3, temperature=1.0, **extra_body(extra)
        )
        assert out.usage.completion_tokens == 3
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    # A seed beyond 32 bits is its own seed, reproducibly, and not that of its low bits.
    texts = [
        client.completions.create(
            model=MODEL, prompt="abc", max_tokens=8, temperature=1.0, seed=seed,
            extra_body={"ignore_eos": True},
        ).choices[0].text
        for seed in (2**40 + 7, 2**40 + 7, 7)
    ]  # fmt: skip
    assert texts[0] == texts[1] != texts[2]


def test_a_request_the_engine_fails_fails_alone_and_the_server_goes_on(server):
    """A request that makes the sampler raise (validation bypassed: no HTTP body can do it)
    gets RequestFailedError while a greedy request in the same steps is answered; then
    /health is 200 and the greedy answer is unchanged."""
    client = server.client()
    before = client.completions.create(model=MODEL, prompt="steady", max_tokens=8, **greedy())
    broken = SamplingParams(temperature=1.0, max_tokens=8, n=2)
    object.__setattr__(broken, "min_p", "high")
    fine = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    async def both():
        bad_queue, good_queue = asyncio.Queue(), asyncio.Queue()
        server.engine.submit(TOKENIZER.encode("break"), broken, bad_queue, 0)
        server.engine.submit(TOKENIZER.encode("steady"), fine, good_queue, 0)
        failure = await asyncio.wait_for(bad_queue.get(), 60)
        tokens = []
        while not tokens or tokens[-1].finish_reason is None:
            tokens.append(await asyncio.wait_for(good_queue.get(), 60))
        return failure, [t for d in tokens for t in d.token_ids]

    failure, tokens = asyncio.run(both())
    assert isinstance(failure, RequestFailedError) and "ValueError" in str(failure)
    assert TOKENIZER.decode(tokens) == before.choices[0].text
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    after = client.completions.create(model=MODEL, prompt="steady", max_tokens=8, **greedy())
    assert after.choices[0].text == before.choices[0].text
    assert server.metric("request_success_total", '{finish_reason="error"}') == 2


def extra_body(fields: dict) -> dict:
    seed = fields.get("seed")
    return {"seed": seed} if seed is not None else {"extra_body": fields}


def test_key_route_size_and_queue_limits(server):
    status, doc = server.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert status == 401 and doc["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    status, doc = server.request("GET", "/v1/nothing")
    assert status == 404 and doc["error"]["type"] == "not_found_error"
    # Chunked upload, no Content-Length: the limit is enforced while reading.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Authorization", f"Bearer {KEY}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for _ in range(10):
        conn.send(b"400\r\n" + b" " * 0x400 + b"\r\n")
    conn.send(b"0\r\n\r\n")
    response = conn.getresponse()
    assert response.status == 413 and "limit" in json.loads(response.read())["error"]["message"]
    conn.close()
    server.engine.max_waiting = 0
    try:
        with pytest.raises(openai.RateLimitError):
            server.client().completions.create(model=MODEL, prompt="x", max_tokens=1)
    finally:
        server.engine.max_waiting = 64


def test_a_request_naming_a_lora_adapter_runs_with_it(tiny_lm_config, tmp_path, write_peft_adapter):
    folder = write_peft_adapter(tmp_path / "sql", tiny_lm_config, seed=1)
    s = Server(tiny_lm_config, adapters={"sql": folder})
    try:
        client = s.client()
        listed = {m.id: m for m in client.models.list().data}
        assert set(listed) == {MODEL, "sql"}
        assert (listed["sql"].parent, listed["sql"].root) == (MODEL, folder)
        answers = {}
        for model in (MODEL, "sql"):
            r = client.completions.create(
                model=model, prompt="hello there", max_tokens=8, **greedy()
            )
            answers[model] = r.choices[0].text
            assert r.model == model
        # The adapter's answer is the offline engine's with that adapter, not the base's.
        offline = LLM(
            nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0)),
            TOKENIZER,
            adapters={"sql": folder},
            max_num_seqs=8,
            max_num_batched_tokens=64,
        )
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        [expected] = offline.generate(["hello there"], params, adapter="sql")
        assert expected.outputs[0].text == answers["sql"] != answers[MODEL]
        with pytest.raises(openai.NotFoundError, match="use one of 'tiny', 'sql'"):
            client.completions.create(model="other", prompt="hi", max_tokens=1)
    finally:
        s.close()


def test_documents_and_template_variables_reach_the_chat_template(tiny_lm_config):
    template = (
        "{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if shout %}!{% endif %}"
    )
    s = Server(tiny_lm_config, chat_template=template)
    try:
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "documents": [{"title": "a", "text": "b"}],
            "chat_template_kwargs": {"shout": True},
        }
        status, answer = s.request("POST", "/tokenize", body)
        assert status == 200 and TOKENIZER.decode(answer["tokens"]) == "[a: b]hi!"
        status, answer = s.request(
            "POST", "/tokenize", {**body, "chat_template_kwargs": {"messages": []}}
        )
        assert status == 400 and answer["error"]["param"] == "chat_template_kwargs"
        assert "sets messages, which the request's own fields set" in answer["error"]["message"]
    finally:
        s.close()


def test_a_step_reaches_the_event_loop_in_one_call_as_the_next_step_launches(tiny_lm_config):
    """The engine thread hands the event loop a step's deltas (of every request) together,
    in one `call_soon_threadsafe`, not one call per sequence; and while another step follows,
    only once that step's inputs are ready and its model is launched (so the loop's HTTP work
    runs beside the model). The last step's deltas leave at once."""
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64)
    llm_engine = LLMEngine(nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0)), TOKENIZER, config)
    engine = AsyncEngine(llm_engine)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def launched() -> int:
        return sum(llm_engine.runner.steps_by_shape.values())

    async def run() -> tuple[list[int], list[list]]:
        loop = asyncio.get_running_loop()
        handoffs = []  # steps launched at each hand-off
        real = loop.call_soon_threadsafe

        def counting(callback, *args, **kw):
            handoffs.append(launched())
            return real(callback, *args, **kw)

        loop.call_soon_threadsafe = counting
        queues = [asyncio.Queue() for _ in range(4)]
        for i, queue in enumerate(queues):
            engine.submit(TOKENIZER.encode(f"prompt {i}"), params, queue, 0)
        got = []
        for queue in queues:
            deltas = [await queue.get()]
            while deltas[-1].finish_reason is None:
                deltas.append(await queue.get())
            got.append(deltas)
        return handoffs, got

    engine.start()
    try:
        handoffs, got = asyncio.run(run())
    finally:
        engine.shutdown()
    assert [sum(len(d.token_ids) for d in deltas) for deltas in got] == [6] * 4
    # Every step has deltas for the loop (the first request's prefill may run alone before
    # the others arrive): one hand-off each, for 24 deltas; step k's leave as step k + 1 is
    # launched, the last step's right after it.
    steps = launched()
    assert steps <= 9
    assert handoffs == [*range(2, steps + 1), steps]
