"""The OpenAI-compatible HTTP front end of an AsyncEngine (FastAPI).

Routes: /v1/completions, /v1/chat/completions (both streamable as server-sent events, with
`stream_options.include_usage`), /v1/models, /tokenize, /detokenize, /tokenizer_info,
/health, /metrics.
Request bodies are the pydantic models of `protocol`. Errors use OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`: 400 for bad fields (`param` names the
field), 401 without the API key, 404 for unknown routes and models (`model_not_found`), 413
for oversized bodies, 429 when the queue is full, 500 for a request the engine failed. A
request that fails never disturbs the others; a streaming client that disconnects has its
sequences aborted, which frees their KV blocks.

A choice's answer is built from its engine deltas by one builder (`_CompletionChoice`,
`_ChatChoice`) whose pieces a stream sends one by one and an unstreamed answer concatenates,
so the two agree on text, tokens, log-probabilities and text offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from jaxstack.serving._src.errors import (
    Error,
    InvalidFieldError,
    InvalidInputError,
    ModelNotFoundError,
)
from jaxstack.serving._src.http_common import AuthenticationError, read_body, status_of
from jaxstack.serving._src.llm import protocol
from jaxstack.serving._src.llm.async_engine import AsyncEngine, Delta
from jaxstack.serving._src.llm.tokenization import encode_text
from jaxstack.serving._src.llm.tool_calls import ToolCallParser

logger = logging.getLogger("jaxstack.serving.llm")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class UnknownModelError(ModelNotFoundError):
    """The request names a model this server does not serve (404, as OpenAI answers)."""

    param = "model"
    code = "model_not_found"
    error_type = "invalid_request_error"


def error_response(
    status: int, message: str, param: str | None = None, code=None, error_type=None
) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": error_type or _ERROR_TYPES.get(status, "server_error"),
            "param": param,
            "code": code if code is not None else status,
        }
    }
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(body, status_code=status, headers=headers)


def _error(e: BaseException) -> JSONResponse:
    status = status_of(e)
    if status == 500:
        logger.error("request failed", exc_info=e)
        return error_response(500, f"{type(e).__name__}: {e}")
    return error_response(
        status,
        str(e),
        getattr(e, "param", None),
        getattr(e, "code", None),
        getattr(e, "error_type", None),
    )


# Appended to the last message to find where its content ends in the rendered prompt
# (transformers' `continue_final_message` marker).
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _cut_at_continue_tag(text: str, final: str) -> str:
    """The rendered prompt up to the end of the last message's content, as transformers'
    `apply_chat_template(continue_final_message=True)` cuts it."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise InvalidFieldError(
            "continue_final_message",
            "the chat template does not write the last message's content as sent, so the "
            "prompt cannot end inside it; leave 'continue_final_message' out",
        )
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the content's trailing space


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class _CompletionChoice:
    """One /v1/completions choice: (text, logprobs) pieces from its deltas.

    `text_offset` counts characters of the choice's whole text, so it goes on from one piece
    to the next; with `echo` the first piece starts with the prompt (and, with logprobs, the
    prompt tokens' own log-probabilities, the first None).
    """

    def __init__(self, token_text: Callable[[int], str], *, k: int | None, echo: str | None):
        self.token_text = token_text
        self.k = k
        self.echo = echo
        self.offset = 0

    def piece(self, d: Delta) -> tuple[str, dict[str, Any] | None]:
        text, tokens, lps, tops = d.text, d.token_ids, d.logprobs, d.top_logprobs or []
        if self.echo is not None and d.prompt_token_ids:
            text = self.echo + text
            if self.k is not None:
                prompt = d.prompt_token_ids
                entries = zip(d.prompt_logprobs[1:], prompt[1:], strict=True)
                p_lps = [None] + [entry[t] for entry, t in entries]
                tokens, lps, tops = prompt + tokens, p_lps + lps, d.prompt_logprobs + tops
        if self.k is None:
            return text, None
        texts = [self.token_text(t) for t in tokens]
        offsets = []
        for t in texts:
            offsets.append(self.offset)
            self.offset += len(t)
        return text, {
            "tokens": texts,
            "token_logprobs": lps,
            "top_logprobs": [
                None
                if top is None
                else {self.token_text(i): v for i, v in list(top.items())[: self.k]}
                for top in tops
            ],
            "text_offset": offsets,
        }

    @staticmethod
    def merge(pieces: list[tuple[str, dict[str, Any] | None]]) -> tuple[str, Any]:
        text = "".join(t for t, _ in pieces)
        if not pieces or pieces[0][1] is None:
            return text, None
        keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        return text, {key: [x for _, lp in pieces for x in lp[key]] for key in keys}


class _ChatChoice:
    """One /v1/chat/completions choice: (content, logprobs.content entries) pieces."""

    def __init__(self, token_text: Callable[[int], str], *, k: int | None):
        self.token_text = token_text
        self.k = k

    def entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def piece(self, d: Delta) -> tuple[str, list[dict[str, Any]] | None]:
        if self.k is None:
            return d.text, None
        tops = d.top_logprobs or [{}] * len(d.token_ids)
        return d.text, [
            {**self.entry(t, lp), "top_logprobs": [self.entry(i, v) for i, v in top.items()]}
            for t, lp, top in zip(d.token_ids, d.logprobs, tops, strict=True)
        ]

    @staticmethod
    def merge(pieces: list[tuple[str, Any]]) -> tuple[str, Any]:
        text = "".join(t for t, _ in pieces)
        if not pieces or pieces[0][1] is None:
            return text, None
        return text, {"content": [e for _, content in pieces for e in content]}


def _most_likely(choices: list[list[Delta]], sampled: int, n: int) -> list[int]:
    """Indices of the choices to answer: per prompt, the n of its `sampled` sequences with the
    highest cumulative log-probability (best_of), in the order they were sampled; all of them
    when sampled == n."""
    if sampled == n:
        return list(range(len(choices)))
    kept = []
    for start in range(0, len(choices), sampled):
        group = range(start, start + sampled)
        score = {c: sum(lp for d in choices[c] for lp in d.logprobs) for c in group}
        kept += sorted(sorted(group, key=score.__getitem__, reverse=True)[:n])
    return kept


class _ToolCalls:
    """One chat choice's answer read for tool calls (see tool_calls.py). A choice that made a
    call finishes with reason "tool_calls", as OpenAI's do."""

    def __init__(self, parallel: bool):
        self.parser = ToolCallParser()
        self.parallel = parallel
        self.calls: list[dict[str, Any]] = []

    def _take(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.parallel:
            calls = calls[: max(0, 1 - len(self.calls))]
        self.calls += calls
        return calls

    def _reason(self, finish_reason: str | None) -> str | None:
        return "tool_calls" if finish_reason == "stop" and self.calls else finish_reason

    def delta(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """A streamed chunk's delta: the content that is surely content, and closed calls."""
        content, calls = self.parser.feed(text)
        if finish_reason is not None:
            rest, more = self.parser.finish()
            content, calls = content + rest, calls + more
        first = len(self.calls)
        calls = self._take(calls)
        delta: dict[str, Any] = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = [{"index": first + j, **c} for j, c in enumerate(calls)]
        return delta, self._reason(finish_reason)

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """A whole answer's message: content, and tool_calls when it made any."""
        content, calls = self.parser.feed(text)
        rest, more = self.parser.finish()
        self._take(calls + more)
        content += rest
        if not self.calls:
            return {"role": "assistant", "content": content}, finish_reason
        message = {"role": "assistant", "content": content or None, "tool_calls": self.calls}
        return message, self._reason(finish_reason)


def create_llm_app(
    engine: AsyncEngine,
    *,
    model_name: str,
    tokenizer: Any,
    chat_template: Any = None,
    api_key: str | None = None,
    max_request_bytes: int = 1 << 20,
    max_n: int = 128,
) -> FastAPI:
    """A FastAPI app serving `engine` (started by the app's lifespan, stopped after the last
    in-flight stream has drained) under the OpenAI API.

    Args:
      chat_template: a datalib ChatTemplate; without one, chat requests are refused (400).
      max_n: the largest `n` a request may ask for.

    A request's `model` is the served model's name or one of the engine's LoRA adapters'.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="jaxstack LLM server", docs_url=None, redoc_url=None, lifespan=lifespan)
    max_model_len = engine.engine.config.max_model_len
    adapters = engine.engine.adapters  # LoRA adapter name -> its folder
    max_logprobs = engine.engine.config.max_logprobs
    created = int(time.time())

    @app.exception_handler(Error)
    async def _package_error(request: Request, e: Error) -> JSONResponse:
        return _error(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {e.detail}"
        return error_response(e.status_code, message)

    async def authorized(request: Request) -> None:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise AuthenticationError(
                "missing or wrong API key; send 'Authorization: Bearer <key>'"
            )

    async def parse[R: BaseModel](request: Request, kind: type[R]) -> R:
        body = protocol.parse(kind, await read_body(request, max_request_bytes))
        if body.model is not None and body.model not in (model_name, *adapters):
            served = ", ".join(repr(m) for m in (model_name, *adapters))
            raise UnknownModelError(
                f"the model {body.model!r} is not served here; use one of {served}"
            )
        for name in ("n", "best_of"):
            value = getattr(body, name, None)
            if value is not None and value > max_n:
                raise InvalidFieldError(
                    name, f"{name}={value} is above this server's limit of {max_n} (--max-n)"
                )
        return body

    def encode(text: str, *, add_special_tokens: bool = True) -> list[int]:
        if tokenizer is None:
            raise InvalidFieldError("prompt", "this model has no tokenizer; send token ids")
        return encode_text(tokenizer, text, add_special_tokens=add_special_tokens)

    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id]) if tokenizer is not None else f"<{token_id}>"

    def render_chat(
        messages: list[protocol.ChatMessage],
        add_generation_prompt: bool,
        tools: list[protocol.Tool] | None,
        body: protocol.ChatCompletionRequest | protocol.TokenizeRequest,
    ):
        if chat_template is None or tokenizer is None:
            raise InvalidFieldError(
                "messages",
                "this model has no chat template; start the server with --chat-template FILE "
                "(a Jinja template) or send prompts to /v1/completions",
            )
        extra = {}
        if tools:
            if "tools" not in chat_template.source:
                raise InvalidFieldError(
                    "tools",
                    "this model's chat template does not render tools, so the model would never "
                    "see them; serve it with a --chat-template that does (a Hermes/Qwen2.5-style "
                    "one) or leave 'tools' out",
                )
            extra["tools"] = [t.sent for t in tools]
        if body.documents is not None:
            extra["documents"] = body.documents
        extra |= body.chat_template_kwargs or {}
        rendered = [m.for_template() for m in messages]
        final = rendered[-1]["content"]
        if body.continue_final_message:
            rendered[-1]["content"] = final + _CONTINUE_TAG
        try:
            text = chat_template.render(
                rendered, add_generation_prompt=add_generation_prompt, **extra
            )
        except Exception as e:  # the template's own raise_exception, or a template bug
            raise InvalidFieldError(
                "messages", f"the chat template cannot render these messages: {e}"
            ) from None
        if body.continue_final_message:
            text = _cut_at_continue_tag(text, final)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidFieldError(
                "messages", "messages hold a lone surrogate; send well-formed text"
            ) from None
        return encode(text, add_special_tokens=False)

    def check_logprobs(param: str, k: int | None) -> None:
        if k is not None and k > max_logprobs:
            raise InvalidFieldError(
                param, f"{param}={k} is above this server's limit of {max_logprobs} "
                "(--max-logprobs)"
            )  # fmt: skip

    async def run(
        prompts: list[list[int]], params, model: str | None, *, chat: bool = False
    ) -> tuple[asyncio.Queue, list[str]]:
        """Submit the prompts, with the LoRA adapter the request's `model` names, if any.
        A chat request's prompt is its rendered messages, so the engine's complaints about
        the prompt name 'messages' instead."""
        adapter = model if model in adapters else None
        queue: asyncio.Queue = asyncio.Queue()
        ids = []
        try:
            for tag, ids_ in enumerate(prompts):
                ids.append(engine.submit(ids_, params, queue, tag, adapter=adapter))
        except Exception as e:
            for request_id in ids:
                engine.abort(request_id)
            if chat and isinstance(e, InvalidFieldError) and e.param == "prompt":
                message = str(e).replace("prompt has", "the rendered messages have")
                message = message.replace("shorten the prompt", "shorten the messages")
                raise InvalidFieldError("messages", message) from None
            raise
        return queue, ids

    async def deltas(queue: asyncio.Queue, total: int) -> AsyncIterator[Delta]:
        finished = 0
        while finished < total:
            d = await queue.get()
            if isinstance(d, BaseException):
                raise d
            finished += d.finish_reason is not None
            yield d

    def sse(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def stream(queue, request_ids, total, chunks, final) -> StreamingResponse:
        """SSE of `chunks(delta)` payloads, then `final()` ones, then [DONE]; aborts the
        requests when the client goes away (the generator is closed early)."""

        async def events() -> AsyncIterator[str]:
            done = False
            try:
                async for d in deltas(queue, total):
                    for payload in chunks(d):
                        yield sse(payload)
                for payload in final():
                    yield sse(payload)
                yield "data: [DONE]\n\n"
                done = True
            except Error as e:
                yield sse(json.loads(_error(e).body))
            finally:
                if not done:
                    for request_id in request_ids:
                        engine.abort(request_id)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def collect(queue, request_ids, total, n) -> list[list[Delta]]:
        """Every delta of the request, grouped by choice index."""
        choices: list[list[Delta]] = [[] for _ in range(total)]
        try:
            async for d in deltas(queue, total):
                choices[d.tag * n + d.index].append(d)
        except BaseException:
            for request_id in request_ids:
                engine.abort(request_id)
            raise
        return choices

    def include_usage(body: protocol.CompletionRequest | protocol.ChatCompletionRequest) -> bool:
        return body.stream_options is not None and body.stream_options.include_usage

    # -------------------------------------------------------------------- completions
    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request) -> Response:
        body = await parse(request, protocol.CompletionRequest)
        texts = [p if isinstance(p, str) else None for p in body.prompt]
        prompts = [
            encode(p, add_special_tokens=body.add_special_tokens) if isinstance(p, str) else p
            for p in body.prompt
        ]
        k = body.logprobs
        check_logprobs("logprobs", k)
        params = protocol.sampling_params(
            body,
            max_tokens=body.max_tokens,
            logprobs=k,
            prompt_logprobs=k if body.echo else None,
        )
        n = params.n
        if body.best_of is not None:  # sample best_of, answer the n most likely
            params = params.replace(n=body.best_of)
        total = len(prompts) * params.n

        def echo(tag: int) -> str | None:
            if not body.echo:
                return None
            if texts[tag] is not None:
                return texts[tag]
            return tokenizer.decode(prompts[tag]) if tokenizer is not None else ""

        builders = [
            _CompletionChoice(token_text, k=k, echo=echo(i // params.n)) for i in range(total)
        ]
        queue, request_ids = await run(prompts, params, body.model)
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model or model_name,
        }
        prompt_tokens = sum(len(p) for p in prompts)
        if body.stream:
            completion_tokens = 0

            def chunks(d: Delta):
                nonlocal completion_tokens
                completion_tokens += len(d.token_ids)
                index = d.tag * n + d.index
                text, lp = builders[index].piece(d)
                if not (text or d.token_ids or d.finish_reason or (lp and lp["tokens"])):
                    return []
                choice = {"index": index, "text": text, "logprobs": lp}
                choice["finish_reason"] = d.finish_reason
                return [{**head, "choices": [choice], "usage": None}]

            def final():
                if not include_usage(body):
                    return []
                return [{**head, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)}]

            return stream(queue, request_ids, total, chunks, final)
        choices = await collect(queue, request_ids, total, params.n)
        kept = _most_likely(choices, params.n, n)
        out = []
        for i, c in enumerate(kept):
            builder, ds = builders[c], choices[c]
            text, lp = builder.merge([builder.piece(d) for d in ds])
            out.append(
                {"index": i, "text": text, "logprobs": lp, "finish_reason": ds[-1].finish_reason}
            )
        completion_tokens = sum(len(d.token_ids) for ds in choices for d in ds)
        return JSONResponse(
            {**head, "choices": out, "usage": _usage(prompt_tokens, completion_tokens)}
        )

    # --------------------------------------------------------------- chat completions
    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request) -> Response:
        body = await parse(request, protocol.ChatCompletionRequest)
        tools = body.tools if body.offers_tools else None
        prompt = render_chat(body.messages, body.add_generation_prompt, tools, body)
        k = (body.top_logprobs or 0) if body.logprobs else None
        check_logprobs("top_logprobs", k)
        max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
        params = protocol.sampling_params(body, max_tokens=max_tokens, logprobs=k)
        if tools and body.forces_tool_call:
            params = params.replace(structured_output=body.tool_call_grammar())
        n = params.n
        builders = [_ChatChoice(token_text, k=k) for _ in range(n)]
        calls = [_ToolCalls(body.parallel_tool_calls) if tools else None for _ in range(n)]
        queue, request_ids = await run([prompt], params, body.model, chat=True)
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model or model_name,
        }
        if body.stream:
            head = {**head, "object": "chat.completion.chunk"}
            completion_tokens = 0

            def chunk(index: int, delta: dict, logprobs, finish_reason) -> dict[str, Any]:
                choice = {"index": index, "delta": delta, "logprobs": logprobs}
                choice["finish_reason"] = finish_reason
                return {**head, "usage": None, "choices": [choice]}

            def chunks(d: Delta):
                nonlocal completion_tokens
                completion_tokens += len(d.token_ids)
                out = []
                if d.prompt_token_ids:  # a sequence's first delta opens its message
                    out.append(chunk(d.index, {"role": "assistant", "content": ""}, None, None))
                text, lp = builders[d.index].piece(d)
                delta = {"content": text} if text else {}
                finish_reason = d.finish_reason
                if calls[d.index] is not None:
                    delta, finish_reason = calls[d.index].delta(text, finish_reason)
                if delta or d.token_ids or finish_reason:
                    out.append(chunk(d.index, delta, {"content": lp} if lp else None,
                                     finish_reason))  # fmt: skip
                return out

            def final():
                if not include_usage(body):
                    return []
                return [{**head, "choices": [], "usage": _usage(len(prompt), completion_tokens)}]

            return stream(queue, request_ids, n, chunks, final)
        choices = await collect(queue, request_ids, n, n)
        out = []
        for i, (builder, ds) in enumerate(zip(builders, choices, strict=True)):
            text, lp = builder.merge([builder.piece(d) for d in ds])
            message, finish_reason = {"role": "assistant", "content": text}, ds[-1].finish_reason
            if calls[i] is not None:
                message, finish_reason = calls[i].message(text, finish_reason)
            out.append(
                {"index": i, "message": message, "logprobs": lp, "finish_reason": finish_reason}
            )
        completion_tokens = sum(len(d.token_ids) for ds in choices for d in ds)
        return JSONResponse(
            {**head, "choices": out, "usage": _usage(len(prompt), completion_tokens)}
        )

    # ------------------------------------------------------------------------ others
    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "jaxstack",
            "root": model_name,
            "max_model_len": max_model_len,
        }
        cards = [card]
        cards += [
            card | {"id": name, "root": str(folder), "parent": model_name}
            for name, folder in adapters.items()
        ]
        return {"object": "list", "data": cards}

    @app.post("/tokenize", dependencies=[Depends(authorized)])
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await parse(request, protocol.TokenizeRequest)
        if body.messages is not None:
            tokens = render_chat(body.messages, body.add_generation_prompt, body.tools, body)
        else:
            tokens = encode(body.prompt, add_special_tokens=body.add_special_tokens)
        out = {"tokens": tokens, "count": len(tokens), "max_model_len": max_model_len}
        if body.return_token_strs:  # the vocabulary's strings, as convert_ids_to_tokens gives
            backend = getattr(tokenizer, "backend", None)
            out["token_strs"] = [
                backend.id_to_token(t) if backend is not None else token_text(t) for t in tokens
            ]
        return out

    @app.get("/tokenizer_info", dependencies=[Depends(authorized)])
    async def tokenizer_info() -> dict[str, Any]:
        """vLLM's /tokenizer_info: what a client needs to tokenize through /tokenize (lm-eval
        reads it to choose its remote tokenizer): the special tokens' text and the chat
        template."""
        named = chat_template.special_tokens if chat_template is not None else {}
        backend = getattr(tokenizer, "backend", None)

        def text(name: str) -> str | None:
            token_id = getattr(tokenizer, f"{name}_id", None)
            if f"{name}_token" in named:
                return named[f"{name}_token"]
            return backend.id_to_token(token_id) if None not in (backend, token_id) else None

        return {
            "tokenizer_class": type(tokenizer).__name__ if tokenizer is not None else None,
            **{f"{name}_token": text(name) for name in ("bos", "eos", "pad", "unk")},
            "chat_template": chat_template.source if chat_template is not None else None,
            "model_max_length": max_model_len,
        }

    @app.post("/detokenize", dependencies=[Depends(authorized)])
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await parse(request, protocol.DetokenizeRequest)
        vocab = engine.engine.model_config.vocab_size
        if not all(t < vocab for t in body.tokens):
            raise InvalidFieldError("tokens", f"'tokens' must be token ids in [0, {vocab})")
        if tokenizer is None:
            raise InvalidInputError("this model has no tokenizer")
        return {"prompt": tokenizer.decode(body.tokens)}

    @app.get("/health")
    async def health() -> Response:
        if engine.alive:
            return JSONResponse({"status": "ok"})
        return error_response(503, "the engine has stopped; see the server log")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app
