"""Chat templates of real models rendered by the server equal transformers' token for token.

The templates in chat_templates/ are those of Llama 3.1 Instruct, Qwen2.5 Instruct, Mistral 7B
Instruct v0.3 and Gemma 2 IT, as their tokenizer_config.json ship them. Each model folder here
is an HF folder (config.json, safetensors, tokenizer.json, tokenizer_config.json and, for two of
them, chat_template.jinja) over a small tokenizer trained in the test that holds the model's
special tokens; the same folder is read by `AutoTokenizer.from_pretrained` and by the server,
and the server's /tokenize of a conversation must equal `apply_chat_template(...,
tokenize=True)`: system messages, multi-turn, tools, tool calls and their results, with and
without the generation prompt. Skips when transformers is absent.
"""

from __future__ import annotations

import json
import pathlib
import string

import pytest
import tokenizers
from fastapi.testclient import TestClient
from flax import nnx
from tokenizers import decoders, models, pre_tokenizers, trainers

from jaxstack import nnlib
from jaxstack.serving import EngineConfig, LLMEngine
from jaxstack.serving._src.llm.async_engine import AsyncEngine
from jaxstack.serving._src.llm.loading import load_model
from jaxstack.serving._src.llm.openai_server import create_llm_app

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

TEMPLATES = pathlib.Path(__file__).parent / "chat_templates"

# name: (template file, special tokens, other added tokens, the file that holds the template,
# byte-level or SentencePiece-style words)
MODELS = {
    "llama-3.1": (
        "llama-3.1-instruct.jinja",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"],
        "tokenizer_config.json",
        "byte-level",
    ),
    "qwen2.5": (
        "qwen2.5-instruct.jinja",
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        ["<|im_start|>", "<tool_call>", "</tool_call>"],
        "chat_template.jinja",
        "byte-level",
    ),
    "mistral-v0.3": (
        "mistral-7b-instruct-v0.3.jinja",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        [
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_CALLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ],
        "chat_template.jinja",
        "metaspace",
    ),
    "gemma-2": (
        "gemma-2-it.jinja",
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
        ["<start_of_turn>", "<end_of_turn>"],
        "tokenizer_config.json",
        "metaspace",
    ),
}

CORPUS = [
    "You are a terse assistant. What is the weather in Paris today? It is 22 C and sunny.",
    "Cutting Knowledge Date: December 2023. Today Date: 26 Jul 2024. Environment: ipython",
    "Given the following functions, please respond with a JSON for a function call.",
    '{"name": "get_weather", "parameters": {"city": "Paris"}, "type": "object"}',
    "You may call one or more functions to assist with the user query. <tools></tools>",
    "And 3+3? Ünïcödé ✓ 中文 — the model answers 6.",
] * 20

SYSTEM = {"role": "system", "content": "You are terse.\n"}
USER = {"role": "user", "content": "What is 2+2?"}
ANSWER = {"role": "assistant", "content": "  4  "}
USER2 = {"role": "user", "content": "And 3+3? Ünïcödé ✓ 中文"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}
# The same tool with its keys in another order: templates that write tools out (tojson,
# items()) keep the client's order, so the server must hand them over as sent.
WEATHER_REORDERED = {
    "function": {
        "parameters": WEATHER["function"]["parameters"],
        "name": "get_weather",
        "description": "The weather in a city.",
    },
    "type": "function",
}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call12345",  # Mistral's template wants 9 alphanumeric characters
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call12345", "content": "22 C"}
# The same call as OpenAI clients send it back: `arguments` as JSON text. Templates expect an
# object (they write it with tojson), so the server parses it, as vLLM does.
CALL_AS_JSON_TEXT = {
    **CALL,
    "tool_calls": [{**CALL["tool_calls"][0], "function": {**CALL["tool_calls"][0]["function"]}}],
}
CALL_AS_JSON_TEXT["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'

# name: (messages sent to the server, tools, the messages transformers is given if others)
CONVERSATIONS = {
    "user": ([USER], None, None),
    "system+user": ([SYSTEM, USER], None, None),
    "multi-turn": ([USER, ANSWER, USER2], None, None),
    "system+multi-turn": ([SYSTEM, USER, ANSWER, USER2], None, None),
    "tools": ([USER], [WEATHER], None),
    "tools-keys-reordered": ([USER], [WEATHER_REORDERED], None),
    "tool-call+result": ([USER, CALL, RESULT], [WEATHER], None),
    "tool-call-arguments-as-json-text": ([USER, CALL_AS_JSON_TEXT, RESULT], [WEATHER],
                                         [USER, CALL, RESULT]),
}  # fmt: skip


def _tokenizer_json(special: list[str], kind: str) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>" if "<unk>" in special else None))
    if kind == "byte-level":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:  # SentencePiece-style, as Mistral's and Gemma's tokenizers split words
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        # every character the conversations hold, so that none is dropped or made <unk>
        alphabet = sorted(set("".join(CORPUS)) | set(string.printable) | {"▁"})
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_folder(request, tmp_path_factory) -> tuple[str, pathlib.Path]:
    name = request.param
    template_file, specials, extra, where, kind = MODELS[name]
    template = (TEMPLATES / template_file).read_text(encoding="utf-8")
    tok = _tokenizer_json(list(specials.values()) + extra, kind)
    config = nnlib.get_preset("tiny-llama").replace(vocab_size=tok.get_vocab_size())
    model = nnlib.Transformer(config, rngs=nnx.Rngs(0))
    folder = nnlib.save_hf_checkpoint(model, tmp_path_factory.mktemp(name) / "hf")
    tok.save(str(folder / "tokenizer.json"))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    if where == "tokenizer_config.json":
        tokenizer_config["chat_template"] = template
    else:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return name, folder


@pytest.fixture(scope="module")
def served(model_folder):
    """The OpenAI app over the folder (its engine is never started: /tokenize needs none),
    and transformers' tokenizer of the same folder."""
    name, folder = model_folder
    loaded = load_model(folder)
    engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(max_num_seqs=2))
    app = create_llm_app(
        AsyncEngine(engine),
        model_name=name,
        tokenizer=loaded.tokenizer,
        chat_template=loaded.chat_template,
    )
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    return name, TestClient(app), hf


def _transformers_ids(hf, messages, tools, add_generation_prompt: bool, **options) -> list[int]:
    out = hf.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        **options,
    )
    return list(out["input_ids"] if isinstance(out, dict | transformers.BatchEncoding) else out)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_chat_template_tokens_equal_transformers(served, conversation, add_generation_prompt):
    name, client, hf = served
    messages, tools, hf_messages = CONVERSATIONS[conversation]
    body = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    if tools is not None:
        body["tools"] = tools
    response = client.post("/tokenize", json=body)
    if name == "gemma-2" and tools is not None:
        # Gemma 2's template never shows tools: the server refuses them instead of dropping them.
        assert (response.status_code, response.json()["error"]["param"]) == (400, "tools")
        return
    try:
        expected = _transformers_ids(hf, hf_messages or messages, tools, add_generation_prompt)
    except Exception as e:  # the template's raise_exception: the server must refuse too
        assert response.status_code == 400, response.json()
        assert response.json()["error"]["param"] == "messages"
        assert str(e) in response.json()["error"]["message"]
        return
    assert response.status_code == 200, response.json()
    tokens = response.json()["tokens"]
    assert tokens == expected, (hf.decode(tokens), hf.decode(expected))
    strs = client.post("/tokenize", json={**body, "return_token_strs": True}).json()["token_strs"]
    assert strs == hf.convert_ids_to_tokens(expected)


def test_continue_final_message_equals_transformers(served):
    # vLLM's and transformers' continue_final_message: the prompt ends inside the last
    # (assistant) message, so the model goes on with it instead of starting a new turn.
    _, client, hf = served
    messages = [USER, {"role": "assistant", "content": "The answer is "}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    response = client.post("/tokenize", json=body)
    assert response.status_code == 200, response.json()
    expected = _transformers_ids(hf, messages, None, False, continue_final_message=True)
    assert response.json()["tokens"] == expected, hf.decode(response.json()["tokens"])
    assert hf.decode(expected).rstrip().endswith("The answer is")
    response = client.post("/tokenize", json={**body, "add_generation_prompt": True})
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (400, "continue_final_message")
