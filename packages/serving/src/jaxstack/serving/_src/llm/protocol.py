"""OpenAI request bodies -> prompts and SamplingParams, with errors that name the field.

Fields follow the OpenAI API plus vLLM's extensions (top_k, min_p, repetition_penalty,
stop_token_ids, ignore_eos). Parsing is by hand rather than through pydantic models so that a
bad value is reported as OpenAI does: status 400 and `param` naming the field.
"""

from __future__ import annotations

from typing import Any

from jaxstack.serving._src.errors import InvalidInputError
from jaxstack.serving._src.llm.sampling_params import SamplingParams

_MISSING = object()


class BadField(InvalidInputError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def field(body: dict[str, Any], name: str, kind, default=_MISSING):
    """body[name] checked against `kind` (a type or tuple of types); None means default."""
    value = body.get(name)
    if value is None:
        if default is _MISSING:
            raise BadField(name, f"'{name}' is required")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BadField(name, f"'{name}' must be {names}, got {type(value).__name__}")
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise BadField("stop", "'stop' must be a string or a list of strings")


def sampling_params(
    body: dict[str, Any], *, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    """The sampling fields common to completions and chat completions."""
    stop_ids = field(body, "stop_token_ids", list, [])
    if not all(isinstance(t, int) for t in stop_ids):
        raise BadField("stop_token_ids", "'stop_token_ids' must be a list of integers")
    kwargs = dict(
        n=field(body, "n", int, 1),
        temperature=field(body, "temperature", float, 1.0),
        top_p=field(body, "top_p", float, 1.0),
        top_k=field(body, "top_k", int, 0),
        min_p=field(body, "min_p", float, 0.0),
        seed=field(body, "seed", int, None),
        presence_penalty=field(body, "presence_penalty", float, 0.0),
        frequency_penalty=field(body, "frequency_penalty", float, 0.0),
        repetition_penalty=field(body, "repetition_penalty", float, 1.0),
        ignore_eos=field(body, "ignore_eos", bool, False),
        stop=_stop(body),
        stop_token_ids=stop_ids,
        max_tokens=max_tokens,
        logprobs=logprobs,
    )
    try:
        return SamplingParams(**kwargs)
    except InvalidInputError as e:
        raise BadField(str(e).split("=")[0], str(e)) from None


def completion_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """`prompt`: a string, a list of strings, a list of token ids, or a list of such lists."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [prompt]
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return list(prompt)
    raise BadField(
        "prompt",
        "'prompt' must be a string, a list of strings, a list of token ids, or a list of lists "
        "of token ids",
    )


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadField("messages", "'messages' must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadField("messages", f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is served
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts) or len(texts) != len(content):
                raise BadField("messages", f"messages[{i}].content parts must be text parts")
            content = "".join(texts)
        if content is not None and not isinstance(content, str):
            raise BadField("messages", f"messages[{i}].content must be a string")
        out.append({**m, "content": content or ""})
    return out
