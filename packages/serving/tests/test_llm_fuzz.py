"""No request can break the OpenAI server: generated bodies, valid and not, get 2xx or 4xx.

Hypothesis builds request bodies field by field from values of the right kind, values at and
beyond the edges of each range, arbitrary JSON and lone surrogates, and sends them to a real
server (AsyncEngine + the app, in-process through Starlette's TestClient) on the tiny model.
Afterwards /health is 200 and a greedy request answers exactly as before the run. The default
run sends a few hundred requests; `-m slow` sends thousands.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxstack import datalib, nnlib
from jaxstack.serving import EngineConfig, LLMEngine
from jaxstack.serving._src.llm.async_engine import AsyncEngine
from jaxstack.serving._src.llm.loading import DEFAULT_CHAT_TEMPLATE
from jaxstack.serving._src.llm.openai_server import create_llm_app

TOKENIZER = datalib.ByteTokenizer()
GREEDY = {"prompt": "steady as she goes", "max_tokens": 8, "temperature": 0, "ignore_eos": True}

surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
clean_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
text = st.text(st.characters(codec="utf-8") | surrogate, max_size=12)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
big = st.integers(-(2**70), 2**70)
token_ids = st.lists(st.integers(0, 258), min_size=1, max_size=6)

# Values each field accepts (a valid request draws only these)...
SAMPLING = {
    "model": st.just("tiny"),
    "n": st.integers(1, 3),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 300) | st.integers(0, 2**70),
    "min_p": st.floats(0, 1),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "stop": clean_text | st.lists(clean_text, max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 300), max_size=3),
    "min_tokens": st.integers(0, 4),
    "logit_bias": st.dictionaries(st.integers(0, 300).map(str), st.floats(-100, 100), max_size=3),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "user": clean_text,
    "response_format": st.just({"type": "text"}),
}
COMPLETION = {
    **SAMPLING,
    "prompt": clean_text | token_ids | st.lists(clean_text, min_size=1, max_size=3),
    "max_tokens": st.integers(0, 6),
    "logprobs": st.integers(0, 5),
    "echo": st.booleans(),
    "add_special_tokens": st.booleans(),
}
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"])},
    optional={
        "content": clean_text
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": clean_text})),
        "name": clean_text,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "function": st.fixed_dictionaries(
                        {"name": clean_text, "arguments": clean_text | st.just('{"a": [1]}')}
                    )
                }
            ),
            max_size=2,
        ),
    },
)
CHAT = {
    **SAMPLING,
    "messages": st.lists(message, min_size=1, max_size=3),
    "max_tokens": st.integers(0, 6),
    "max_completion_tokens": st.integers(0, 6),
    "logprobs": st.booleans(),
    "tool_choice": st.just("none"),
    "add_generation_prompt": st.booleans(),
    "continue_final_message": st.booleans(),
}
TOKENIZE = {"prompt": clean_text, "add_special_tokens": st.booleans()}
DETOKENIZE = {"tokens": token_ids}
# ...and values that break them: out of range, of another type, unsupported, or unknown.
WRONG = st.one_of(
    json_value,
    big,
    st.floats(),
    text,
    st.sampled_from([-1, 0, 2**31, 2**63, 2**64, -(2**63) - 1, 1e309, "", [], {}, [[]]]),
)
WRONG_FIELDS = st.sampled_from(
    [*COMPLETION, *CHAT, "stream", "stream_options", "top_logprobs", "tools", "suffix",
     "logit_bias", "best_of", "messages", "prompt", "tokens", "min_tokens"]
) | text  # fmt: skip


def body(fields: dict[str, st.SearchStrategy], required: tuple[str, ...]) -> st.SearchStrategy:
    """A valid body (required fields, any optional ones, maybe streamed), or one with up to
    two fields set to wrong values, or any JSON at all."""
    valid = st.fixed_dictionaries(
        {k: fields[k] for k in required},
        optional={k: v for k, v in fields.items() if k not in required},
    )
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    stream = st.sampled_from([{}, {"stream": True}, usage])
    valid = st.builds(lambda a, b: {**a, **b}, valid, stream)
    broken = st.builds(
        lambda a, wrong: {**a, **dict(wrong)},
        valid,
        st.lists(st.tuples(WRONG_FIELDS, WRONG), min_size=1, max_size=2),
    )
    return st.one_of(valid, valid, broken, json_value)


request = st.one_of(
    st.tuples(st.just("/v1/completions"), body(COMPLETION, ("prompt",))),
    st.tuples(st.just("/v1/chat/completions"), body(CHAT, ("messages",))),
    st.tuples(st.just("/tokenize"), body(TOKENIZE, ("prompt",))),
    st.tuples(st.just("/detokenize"), body(DETOKENIZE, ("tokens",))),
)


@pytest.fixture(scope="module")
def client(tiny_lm_config):
    model = nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0))
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64)
    engine = AsyncEngine(LLMEngine(model, TOKENIZER, config), max_waiting=64)
    app = create_llm_app(
        engine,
        model_name="tiny",
        tokenizer=TOKENIZER,
        chat_template=datalib.ChatTemplate(DEFAULT_CHAT_TEMPLATE),
        max_request_bytes=1 << 16,
        max_n=3,
    )
    with TestClient(app) as c:
        yield c


def send(client: TestClient, path: str, payload) -> tuple[int, str]:
    raw = json.dumps(payload, allow_nan=True).encode()
    response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    return response.status_code, response.text


def check(client: TestClient, path: str, payload) -> None:
    status, answer = send(client, path, payload)
    assert 200 <= status < 300 or 400 <= status < 500, (status, payload, answer)
    if status >= 400:
        error = json.loads(answer)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert error["type"] == ("invalid_request_error" if status in (400, 404) else error["type"])
    elif '"error"' in answer and "data:" in answer:  # a stream may only end in an error chunk
        raise AssertionError((payload, answer))


def fuzz(client: TestClient, examples: int) -> None:
    status, before = send(client, "/v1/completions", GREEDY)
    assert status == 200

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request)
    def one(path_and_payload):
        check(client, *path_and_payload)

    one()
    assert client.get("/health").json() == {"status": "ok"}
    status, after = send(client, "/v1/completions", GREEDY)
    assert status == 200
    assert json.loads(after)["choices"] == json.loads(before)["choices"]


def test_generated_requests_get_2xx_or_4xx_and_leave_greedy_unchanged(client):
    fuzz(client, 300)


@pytest.mark.slow
def test_thousands_of_generated_requests(client):
    fuzz(client, 4000)
