"""The OpenAI-compatible HTTP front end of an AsyncEngine (FastAPI).

Routes: /v1/completions, /v1/chat/completions (both streamable as server-sent events, with
`stream_options.include_usage`), /v1/models, /tokenize, /detokenize, /health, /metrics.
Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for bad
fields (and unknown models, prompts or max_tokens beyond the context), 401 without the API
key, 404 for unknown routes, 413 for oversized bodies, 429 when the queue is full. A request
that fails never disturbs the others; a streaming client that disconnects has its sequences
aborted, which frees their KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from jaxstack.serving._src.errors import Error, InvalidInputError
from jaxstack.serving._src.http_common import AuthenticationError, read_body, status_of
from jaxstack.serving._src.llm import protocol
from jaxstack.serving._src.llm.async_engine import AsyncEngine, Delta
from jaxstack.serving._src.llm.protocol import BadField, field

logger = logging.getLogger("jaxstack.serving.llm")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_response(status: int, message: str, param: str | None = None, code=None) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error"),
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
    return error_response(status, str(e), getattr(e, "param", None), getattr(e, "code", None))


class _Choice:
    """Accumulates one sequence's deltas for a non-streamed response."""

    def __init__(self):
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] = []
        self.finish_reason: str | None = None
        self.prompt_token_ids: list[int] = []
        self.prompt_logprobs = None

    def add(self, d: Delta) -> None:
        self.token_ids += d.token_ids
        self.text += d.text
        self.logprobs += d.logprobs
        self.top_logprobs += d.top_logprobs or []
        self.finish_reason = d.finish_reason
        if d.prompt_token_ids:
            self.prompt_token_ids, self.prompt_logprobs = d.prompt_token_ids, d.prompt_logprobs


def create_llm_app(
    engine: AsyncEngine,
    *,
    model_name: str,
    tokenizer: Any,
    chat_template: Any = None,
    api_key: str | None = None,
    max_request_bytes: int = 1 << 20,
) -> FastAPI:
    """A FastAPI app serving `engine` (started by the app's lifespan, stopped after the last
    in-flight stream has drained) under the OpenAI API."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="jaxstack LLM server", docs_url=None, redoc_url=None, lifespan=lifespan)
    max_model_len = engine.engine.config.max_model_len
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

    async def json_body(request: Request) -> dict[str, Any]:
        raw = await read_body(request, max_request_bytes)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidInputError(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidInputError("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != model_name:
            raise BadField("model", f"model {model!r} is not served here; use {model_name!r}")
        return body

    def encode(prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if tokenizer is None:
                raise BadField("prompt", "this model has no tokenizer; send token ids")
            return list(tokenizer.encode(prompt))
        return prompt

    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id]) if tokenizer is not None else f"<{token_id}>"

    def render_chat(body: dict[str, Any]) -> list[int]:
        if chat_template is None or tokenizer is None:
            raise InvalidInputError("this model has no chat template; use /v1/completions")
        text = chat_template.render(
            protocol.chat_messages(body),
            add_generation_prompt=field(body, "add_generation_prompt", bool, True),
        )
        return list(tokenizer.encode(text))

    async def run(prompts: list[list[int]], params) -> tuple[asyncio.Queue, list[str]]:
        queue: asyncio.Queue = asyncio.Queue()
        ids = []
        try:
            for tag, ids_ in enumerate(prompts):
                ids.append(engine.submit(ids_, params, queue, tag))
        except Exception:
            for request_id in ids:
                engine.abort(request_id)
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

    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

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

    async def collect(queue, request_ids, total, n) -> list[_Choice]:
        choices = [_Choice() for _ in range(total)]
        try:
            async for d in deltas(queue, total):
                choices[d.tag * n + d.index].add(d)
        except BaseException:
            for request_id in request_ids:
                engine.abort(request_id)
            raise
        return choices

    def include_usage(body: dict[str, Any]) -> bool:
        options = field(body, "stream_options", dict, {})
        return bool(options.get("include_usage", False))

    # -------------------------------------------------------------------- completions
    def completion_logprobs(tokens, logprobs, tops, offset: int, k: int) -> dict[str, Any]:
        texts = [token_text(t) for t in tokens]
        offsets, at = [], offset
        for t in texts:
            offsets.append(at)
            at += len(t)
        return {
            "tokens": texts,
            "token_logprobs": logprobs,
            "top_logprobs": [
                None if top is None else {token_text(i): lp for i, lp in list(top.items())[:k]}
                for top in tops
            ],
            "text_offset": offsets,
        }

    def prompt_scores(choice: _Choice) -> tuple[list, list]:
        """Prompt tokens' own log-probabilities and alternatives (first: None)."""
        lps = [None] + [
            entry[t]
            for entry, t in zip(
                choice.prompt_logprobs[1:], choice.prompt_token_ids[1:], strict=True
            )
        ]
        return lps, list(choice.prompt_logprobs)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request) -> Response:
        body = await json_body(request)
        prompts = [encode(p) for p in protocol.completion_prompts(body)]
        echo = field(body, "echo", bool, False)
        k = field(body, "logprobs", int, None)
        params = protocol.sampling_params(
            body, max_tokens=field(body, "max_tokens", int, 16), logprobs=k
        )
        if echo and k is not None:
            params = params.replace(prompt_logprobs=k)
        n = params.n
        total = len(prompts) * n
        queue, request_ids = await run(prompts, params)
        rid, model = f"cmpl-{uuid.uuid4().hex}", model_name
        head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
        if field(body, "stream", bool, False):
            counts = {"completion": 0}
            with_usage = include_usage(body)

            def chunks(d: Delta):
                counts["completion"] += len(d.token_ids)
                text, lp = d.text, None
                if echo and d.prompt_token_ids:
                    text = (tokenizer.decode(d.prompt_token_ids) if tokenizer else "") + text
                if k is not None:
                    lp = completion_logprobs(d.token_ids, d.logprobs, d.top_logprobs or [], 0, k)
                if not (text or d.token_ids or d.finish_reason):
                    return []
                choice = {
                    "index": d.tag * n + d.index,
                    "text": text,
                    "logprobs": lp,
                    "finish_reason": d.finish_reason,
                }
                return [{**head, "choices": [choice], "usage": None}]

            def final():
                if not with_usage:
                    return []
                prompt_tokens = sum(len(p) for p in prompts)
                return [
                    {**head, "choices": [], "usage": usage(prompt_tokens, counts["completion"])}
                ]

            return stream(queue, request_ids, total, chunks, final)
        choices = await collect(queue, request_ids, total, n)
        out = []
        for i, c in enumerate(choices):
            text, lp = c.text, None
            prompt_text = tokenizer.decode(c.prompt_token_ids) if (echo and tokenizer) else ""
            if k is not None:
                tokens, lps, tops = c.token_ids, c.logprobs, c.top_logprobs
                if echo:
                    p_lps, p_tops = prompt_scores(c)
                    tokens, lps, tops = c.prompt_token_ids + tokens, p_lps + lps, p_tops + tops
                lp = completion_logprobs(tokens, lps, tops, 0, k)
            out.append(
                {
                    "index": i,
                    "text": prompt_text + text,
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                }
            )
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(c.token_ids) for c in choices)
        return JSONResponse(
            {**head, "choices": out, "usage": usage(prompt_tokens, completion_tokens)}
        )

    # --------------------------------------------------------------- chat completions
    def chat_logprobs(tokens, logprobs, tops, k: int) -> dict[str, Any]:
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            text = token_text(token_id)
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

        return {
            "content": [
                {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in list(top.items())[:k]]}
                for t, lp, top in zip(tokens, logprobs, tops, strict=True)
            ]
        }

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request) -> Response:
        body = await json_body(request)
        prompt = render_chat(body)
        want_logprobs = field(body, "logprobs", bool, False)
        k = field(body, "top_logprobs", int, 0) if want_logprobs else None
        max_tokens = field(body, "max_completion_tokens", int, None)
        max_tokens = field(body, "max_tokens", int, max_tokens)
        params = protocol.sampling_params(body, max_tokens=max_tokens, logprobs=k)
        n = params.n
        queue, request_ids = await run([prompt], params)
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
        }
        if field(body, "stream", bool, False):
            head = {**head, "object": "chat.completion.chunk"}
            counts = {"completion": 0}
            with_usage = include_usage(body)

            def chunks(d: Delta):
                counts["completion"] += len(d.token_ids)
                out = []
                if d.prompt_token_ids:  # a sequence's first delta opens its message
                    delta = {"role": "assistant", "content": ""}
                    out.append(
                        {
                            **head,
                            "usage": None,
                            "choices": [
                                {
                                    "index": d.index,
                                    "delta": delta,
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
                if d.text or d.token_ids or d.finish_reason:
                    lp = None
                    if k is not None and d.token_ids:
                        lp = chat_logprobs(d.token_ids, d.logprobs, d.top_logprobs or [], k)
                    delta = {"content": d.text} if d.text else {}
                    out.append(
                        {
                            **head,
                            "usage": None,
                            "choices": [
                                {
                                    "index": d.index,
                                    "delta": delta,
                                    "logprobs": lp,
                                    "finish_reason": d.finish_reason,
                                }
                            ],
                        }
                    )
                return out

            def final():
                if not with_usage:
                    return []
                return [{**head, "choices": [], "usage": usage(len(prompt), counts["completion"])}]

            return stream(queue, request_ids, n, chunks, final)
        choices = await collect(queue, request_ids, n, n)
        out = [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None
                if k is None
                else chat_logprobs(c.token_ids, c.logprobs, c.top_logprobs, k),
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(choices)
        ]
        completion_tokens = sum(len(c.token_ids) for c in choices)
        return JSONResponse(
            {**head, "choices": out, "usage": usage(len(prompt), completion_tokens)}
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
        return {"object": "list", "data": [card]}

    @app.post("/tokenize", dependencies=[Depends(authorized)])
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        tokens = render_chat(body) if "messages" in body else encode(field(body, "prompt", str))
        return {"tokens": tokens, "count": len(tokens), "max_model_len": max_model_len}

    @app.post("/detokenize", dependencies=[Depends(authorized)])
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        tokens = field(body, "tokens", list)
        vocab = engine.engine.model_config.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in tokens):
            raise BadField("tokens", f"'tokens' must be token ids in [0, {vocab})")
        if tokenizer is None:
            raise InvalidInputError("this model has no tokenizer")
        return {"prompt": tokenizer.decode(tokens)}

    @app.get("/health")
    async def health() -> Response:
        if engine.alive:
            return JSONResponse({"status": "ok"})
        return error_response(503, "the engine has stopped; see the server log")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app
