"""The OpenAI request bodies, declared once as pydantic models, and their SamplingParams.

Every field has its type and range here, and `parse` turns any failure into an
`InvalidFieldError` whose `param` names the field (OpenAI's error shape), so no body reaches
the engine malformed. Fields follow the OpenAI API plus vLLM's extensions (top_k, min_p,
repetition_penalty, stop_token_ids, ignore_eos, min_tokens, add_special_tokens, ...).
A null value means the field's default, as in OpenAI's API. A field this server does not
know is refused by name, and an OpenAI field it does not implement (tools, response_format,
...) is refused with a message saying so: a request is never answered as if a field it sent
had been honoured.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, PrivateAttr

from jaxstack.serving._src.errors import InvalidFieldError, InvalidInputError
from jaxstack.serving._src.llm.guided import StructuredOutput
from jaxstack.serving._src.llm.sampling_params import SamplingParams
from jaxstack.serving._src.llm.tool_calls import CLOSE as CLOSE_CALL
from jaxstack.serving._src.llm.tool_calls import OPEN as OPEN_CALL

_STRUCTURE_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

# OpenAI fields without an implementation here, and the one value of each that asks nothing.
_UNSUPPORTED = {
    "suffix": ("inserting text before a suffix is not supported", None),
    "functions": ("function calling is not supported", []),
    "function_call": ("function calling is not supported", "none"),
    "structured_outputs": ("use response_format or guided_json/regex/choice/grammar", None),
    "audio": ("audio output is not supported", None),
    "modalities": ("only text output is supported", ["text"]),
    "prediction": ("predicted outputs are not supported", None),
}


def _valid_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start : e.end].encode("unicode_escape").decode()
        raise ValueError(
            f"is not valid Unicode text: it holds the lone surrogate {bad} at character "
            f"{e.start}; send well-formed text"
        ) from None
    return text


Text = Annotated[str, AfterValidator(_valid_text)]


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt(value: Any) -> list[str] | list[list[int]]:
    if isinstance(value, str):
        return [_valid_text(value)]
    if isinstance(value, list) and value:
        if all(isinstance(p, str) for p in value):
            return [_valid_text(p) for p in value]
        if all(_is_token_id(t) for t in value):
            return [value]
        if all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in value):
            return value
    raise ValueError(
        "must be a string, a non-empty list of strings, a list of token ids, or a list of "
        "non-empty lists of token ids"
    )


def _stop(value: Any) -> list[str]:
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings):
        raise ValueError("must be a non-empty string or a list of non-empty strings")
    return [_valid_text(s) for s in strings]


def _content(value: Any) -> str:
    """Message content: a string, or text parts (joined, as vLLM does for text-only models)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return _valid_text(value)
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
                and set(part) == {"type", "text"}
            ):
                raise ValueError(
                    f"part {i} is not a text part {{'type': 'text', 'text': ...}}; this "
                    "server reads text only"
                )
            texts.append(_valid_text(part["text"]))
        return "".join(texts)
    raise ValueError("must be a string, a list of text parts, or null")


Prompt = Annotated[list[str] | list[list[int]], PlainValidator(_prompt)]


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's logit_bias: token ids (JSON keys, so strings) to values in [-100, 100]."""
    if not isinstance(value, dict):
        raise ValueError("must be an object mapping token ids to values in [-100, 100]")
    bias = {}
    for key, v in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ValueError(f"has the key {key!r}, which is not a token id")
        if isinstance(v, bool) or not isinstance(v, int | float) or not -100 <= v <= 100:
            raise ValueError(f"maps {key} to {v!r}; values must be numbers in [-100, 100]")
        bias[int(key)] = float(v)
    return bias


Stop = Annotated[list[str], PlainValidator(_stop)]
LogitBias = Annotated[dict[int, float], PlainValidator(_logit_bias)]
Content = Annotated[str, PlainValidator(_content)]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64)]  # any 64-bit seed, signed or not


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class ChatMessage(BaseModel):
    """One turn. Fields beyond role and content (name, tool_calls, ...) reach the chat
    template as they are."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: Annotated[Text, Field(min_length=1)]
    content: Content = ""

    @pydantic.model_validator(mode="after")
    def _extra_fields_are_text(self):
        _check_texts(self.model_extra)
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template receives it. A tool call's `arguments` sent as
        JSON text (as OpenAI clients send an earlier answer back) become the object they
        hold, as vLLM does: templates write them with `tojson`, which would quote the text."""
        message = self.model_dump()
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [_arguments_parsed(call) for call in calls]
        return message


def _arguments_parsed(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("arguments"), str)):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except (ValueError, RecursionError):
        return call  # not JSON: the template gets the text as it came
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def _check_texts(value: Any) -> None:
    """Every string inside a JSON value is well-formed text (keys too)."""
    if isinstance(value, str):
        _valid_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_texts(key)
            _check_texts(item)
    elif isinstance(value, list):
        for item in value:
            _check_texts(item)


class _JsonSchema(BaseModel):
    model_config = _STRICT
    name: Text = "schema"
    description: Text | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: plain text, any JSON object, or JSON of a schema."""

    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None

    @pydantic.model_validator(mode="after")
    def _schema_with_json_schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("'json_schema' goes with type 'json_schema', and only with it")
        return self


def _schema(value: Any) -> dict[str, Any]:
    """vLLM's guided_json: a JSON Schema as an object or as its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("must be a JSON Schema (an object, or its JSON text)") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON Schema (an object, or its JSON text)")
    _check_texts(value)
    return value


class _SamplingRequest(BaseModel):
    """The fields completions and chat completions share."""

    model_config = _STRICT
    unsupported: ClassVar[dict[str, tuple[str, Any]]] = _UNSUPPORTED

    model: Text | None = None
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    seed: Seed | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    stop: Stop = []
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = []
    min_tokens: int = Field(0, ge=0)
    logit_bias: LogitBias = {}
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    response_format: ResponseFormat | None = None
    guided_json: Annotated[dict[str, Any], PlainValidator(_schema)] | None = None
    guided_regex: Text | None = None
    guided_choice: list[Annotated[Text, Field(min_length=1)]] | None = Field(None, min_length=1)
    guided_grammar: Text | None = None

    @pydantic.model_validator(mode="after")
    def _one_structure(self):
        asked = [name for name in _STRUCTURE_FIELDS if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type == "text":
            asked.remove("response_format")
        if len(asked) > 1:
            raise InvalidFieldError(asked[1], f"send one of {' and '.join(asked)}, not both")
        return self

    def structured_output(self) -> StructuredOutput | None:
        """The grammar the output must follow, from whichever field asked for one."""
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            return StructuredOutput("json_object", param="response_format")
        if fmt is not None and fmt.type == "json_schema":
            schema = fmt.json_schema.schema_
            return StructuredOutput("json_schema", schema, param="response_format")
        for name, kind in (
            ("guided_json", "json_schema"),
            ("guided_regex", "regex"),
            ("guided_choice", "choice"),
            ("guided_grammar", "grammar"),
        ):
            if getattr(self, name) is not None:
                return StructuredOutput(kind, getattr(self, name), param=name)
        return None

    @pydantic.model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise InvalidFieldError("stream_options", "'stream_options' needs 'stream': true")
        return self


class CompletionRequest(_SamplingRequest):
    prompt: Prompt
    max_tokens: int = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0)
    add_special_tokens: bool = True
    best_of: int | None = Field(None, ge=1)

    @pydantic.model_validator(mode="after")
    def _best_of_at_least_n_and_not_streamed(self):
        if self.best_of is None:
            return self
        if self.best_of < self.n:
            raise InvalidFieldError("best_of", f"best_of={self.best_of} must be >= n={self.n}")
        if self.stream and self.best_of > self.n:
            raise InvalidFieldError("best_of", "best_of > n cannot be streamed (as in OpenAI)")
        return self


class FunctionDefinition(BaseModel):
    model_config = _STRICT
    name: Annotated[Text, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema, handed to the chat template
    strict: bool | None = None

    @pydantic.model_validator(mode="after")
    def _schema_is_text(self):
        _check_texts(self.parameters)
        return self


class Tool(BaseModel):
    """One tool, checked; `sent` is the JSON object as the client sent it, which the chat
    template receives (as transformers would): templates write tools out key by key, so the
    client's key order is kept."""

    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDefinition
    _sent: dict[str, Any] = PrivateAttr(default_factory=dict)

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _keep_as_sent(cls, data: Any, handler):
        tool = handler(data)
        tool._sent = data if isinstance(data, dict) else tool.model_dump(exclude_none=True)
        return tool

    @property
    def sent(self) -> dict[str, Any]:
        return self._sent


class _FunctionName(BaseModel):
    model_config = _STRICT
    name: Text


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: _FunctionName


# Template variables a request may not set through chat_template_kwargs: the ones the server
# passes itself.
_TEMPLATE_OWN = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


def _template_kwargs(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError("must be an object of template variables")
    if taken := sorted(_TEMPLATE_OWN & set(value)):
        raise ValueError(f"sets {', '.join(taken)}, which the request's own fields set")
    return value


TemplateKwargs = Annotated[dict[str, Any], PlainValidator(_template_kwargs)]
Documents = list[dict[Text, Text]]


class _ChatTemplateFields(BaseModel):
    """What a chat request adds to the template's variables (vLLM's extensions): documents for
    retrieval-augmented templates, and any other variable the template reads; and
    `continue_final_message`, which ends the prompt inside the last message (so the model
    goes on with it) instead of after it."""

    model_config = _STRICT
    documents: Documents | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    continue_final_message: bool = False

    @pydantic.model_validator(mode="after")
    def _continue_or_generation_prompt(self):
        if self.continue_final_message and getattr(self, "add_generation_prompt", False):
            raise InvalidFieldError(
                "continue_final_message",
                "'continue_final_message' continues the last message, 'add_generation_prompt' "
                "starts a new one; set 'add_generation_prompt': false",
            )
        return self


class ChatCompletionRequest(_SamplingRequest, _ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @pydantic.model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidFieldError("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        return self

    @pydantic.model_validator(mode="after")
    def _tool_choice_needs_tools(self):
        if self.tool_choice not in (None, "none") and not self.tools:
            raise InvalidFieldError("tool_choice", "'tool_choice' needs 'tools'")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools]
            if self.tool_choice.function.name not in names:
                raise InvalidFieldError(
                    "tool_choice",
                    f"'tool_choice' names {self.tool_choice.function.name!r}, which is not one "
                    f"of the tools ({', '.join(names)})",
                )
        if self.forces_tool_call and self.structured_output() is not None:
            raise InvalidFieldError(
                "tool_choice", "a forced tool call is its own structured output; send one"
            )
        return self

    @property
    def forces_tool_call(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    def tool_call_grammar(self) -> StructuredOutput:
        """For tool_choice "required" or a named function: the answer is one Hermes-format call
        (`<tool_call>{"name", "arguments"}</tool_call>`) of an allowed tool, its arguments
        valid for the tool's parameters schema."""
        tools = self.tools
        if isinstance(self.tool_choice, NamedToolChoice):
            tools = [t for t in tools if t.function.name == self.tool_choice.function.name]
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t.function.name},
                    "arguments": t.function.parameters or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
        schema = {"anyOf": calls, "x-guidance": {"whitespace_flexible": False}}
        lark = f'start: "{OPEN_CALL}\\n" call "\\n{CLOSE_CALL}"\ncall: %json {json.dumps(schema)}'
        return StructuredOutput("grammar", lark, param="tool_choice")

    @property
    def offers_tools(self) -> bool:
        """Whether the model is told of tools and its answer read for calls."""
        return bool(self.tools) and self.tool_choice != "none"


class TokenizeRequest(_ChatTemplateFields):
    """vLLM's /tokenize: a prompt, or chat messages rendered through the chat template."""

    model_config = _STRICT
    unsupported: ClassVar[dict[str, tuple[str, Any]]] = {}

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[Tool] | None = None  # rendered with the messages, as a chat request's are
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @pydantic.model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise InvalidFieldError("prompt", "send exactly one of 'prompt' and 'messages'")
        return self


class DetokenizeRequest(BaseModel):
    model_config = _STRICT
    unsupported: ClassVar[dict[str, tuple[str, Any]]] = {}

    model: Text | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def parse[R: BaseModel](kind: type[R], raw: bytes) -> R:
    """A request body checked against `kind`; any problem is an InvalidInputError naming the
    field (`param`) when there is one."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON, text or int literal
        raise InvalidInputError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidInputError("request body must be a JSON object")
    body = {name: value for name, value in body.items() if value is not None}
    for name, value in body.items():
        if name in kind.unsupported and value != kind.unsupported[name][1]:
            raise InvalidFieldError(name, f"'{name}': {kind.unsupported[name][0]}; remove it")
    body = {name: value for name, value in body.items() if name not in kind.unsupported}
    try:
        return kind.model_validate(body)
    except pydantic.ValidationError as e:
        raise _field_error(e.errors(include_url=False)[0]) from None
    except RecursionError:
        raise InvalidInputError("request body nests too deeply; flatten it") from None


def _field_error(error: dict[str, Any]) -> InvalidInputError:
    loc = error["loc"]
    if not loc:
        return InvalidInputError(error["msg"])
    param = str(loc[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
    if error["type"] == "missing":
        return InvalidFieldError(param, f"'{param}' is required")
    if error["type"] == "extra_forbidden":
        return InvalidFieldError(param, f"'{param}' is not a field this server knows; remove it")
    message = error["msg"].removeprefix("Value error, ")
    got = repr(error.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    return InvalidFieldError(param, f"'{param}' {message[0].lower()}{message[1:]} (got {got})")


def sampling_params(
    request: CompletionRequest | ChatCompletionRequest,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """The SamplingParams of a validated request."""
    r = request
    return SamplingParams(
        n=r.n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        seed=r.seed,
        presence_penalty=r.presence_penalty,
        frequency_penalty=r.frequency_penalty,
        repetition_penalty=r.repetition_penalty,
        ignore_eos=r.ignore_eos,
        include_stop_str_in_output=r.include_stop_str_in_output,
        stop=r.stop,
        stop_token_ids=r.stop_token_ids,
        min_tokens=r.min_tokens,
        logit_bias=r.logit_bias,
        structured_output=r.structured_output(),
        max_tokens=max_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )
