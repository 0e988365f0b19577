"""The KServe v2 REST front end of a `ModelServer` (FastAPI), plus Prometheus `/metrics`.

Handlers parse JSON themselves rather than through pydantic models: the error messages then
name the KServe field (`inputs[0].shape`), and the hot path skips a validation layer. Every
answer that is not a success is the protocol's `{"error": message}`, framework errors (unknown
route 404, wrong method 405) included: bad request 400, unknown model/version 404, body too
large 413, full queue, draining version or models still loading 503 (with Retry-After);
anything else is a 500 with its message, never a crash.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from jaxstack.serving._src.errors import (
    Error,
    InvalidInputError,
    ModelNotFoundError,
)
from jaxstack.serving._src.http_common import read_body, status_of
from jaxstack.serving._src.models import artifact_format as fmt
from jaxstack.serving._src.models import kserve
from jaxstack.serving._src.models.server import LoadedVersion, ModelServer

logger = logging.getLogger("jaxstack.serving.models")


def _error(error: BaseException) -> JSONResponse:
    status = status_of(error)
    message = str(error) if isinstance(error, Error) else f"{type(error).__name__}: {error}"
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _parse_version(version: str) -> int:
    number = fmt.parse_version(version)
    if number is None:
        raise ModelNotFoundError(f"version {version!r} in the URL must be a positive integer")
    return number


def create_app(server: ModelServer, *, max_request_bytes: int = 64 << 20) -> FastAPI:
    """A FastAPI app serving `server` over KServe v2 REST.

    The server may still be loading (`ModelServer.start(wait=False)`): liveness answers at
    once, readiness says 503 until every model is loaded. Request bodies over
    `max_request_bytes` are refused with 413 as soon as that many bytes have arrived. Setting
    `app.state.draining` (the `serve` shutdown does) makes readiness 503 and every response
    close its connection, so keep-alive clients learn of the shutdown from an answer.
    """
    app = FastAPI(title="jaxstack model server", docs_url=None, redoc_url=None)
    app.state.draining = False
    app.add_exception_handler(Error, _package_error)
    app.add_exception_handler(HTTPException, _framework_error)
    app.include_router(_health_and_metadata(server, app))
    app.include_router(_inference(server, max_request_bytes))
    app.include_router(_operations(server))
    app.add_middleware(_CloseWhileDraining, app_state=app.state)
    return app


async def _package_error(request: Request, error: Exception) -> JSONResponse:
    return _error(error)


async def _framework_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    where = f"{request.method} {request.url.path}"
    message = {
        404: f"no route {where}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(error.status_code, f"{where}: {error.detail}")
    return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)


def _health_and_metadata(server: ModelServer, app: FastAPI) -> APIRouter:
    router = APIRouter()
    version = importlib.metadata.version("jaxstack-serving")

    @router.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {
            "name": "jaxstack-serving",
            "version": version,
            "extensions": ["binary_tensor_data", "model_repository_polling"],
        }

    @router.get("/v2/health/live")
    async def live() -> dict[str, Any]:
        return {"live": True}

    @router.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ready = server.ready and not app.state.draining
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @router.get("/v2/models/{model}")
    async def model_metadata(model: str) -> dict[str, Any]:
        return _model_metadata(server.resolve(model), server.versions(model))

    @router.get("/v2/models/{model}/versions/{version}")
    async def version_metadata(model: str, version: str) -> dict[str, Any]:
        loaded = server.resolve(model, _parse_version(version))
        return _model_metadata(loaded, [loaded.version])

    @router.get("/v2/models/{model}/ready")
    async def model_ready(model: str) -> dict[str, Any]:
        server.resolve(model)
        return {"name": model, "ready": True}

    @router.get("/v2/models/{model}/versions/{version}/ready")
    async def version_ready(model: str, version: str) -> dict[str, Any]:
        server.resolve(model, _parse_version(version))
        return {"name": model, "version": version, "ready": True}

    return router


def _model_metadata(loaded: LoadedVersion, versions: list[int]) -> dict[str, Any]:
    return {
        "name": loaded.name,
        "versions": [str(v) for v in versions],
        "platform": "jaxstack_stablehlo",
        "inputs": [s.to_dict() for s in loaded.signature.inputs],
        "outputs": [s.to_dict() for s in loaded.signature.outputs],
        "parameters": {
            "jax_version": loaded.artifact.metadata.get("jax_version"),
            "platforms": loaded.artifact.metadata.get("platforms"),
            "max_batch_size": loaded.batcher.max_batch_size,
            "batch_sizes": list(loaded.batcher.batch_sizes),
        },
    }


def _inference(server: ModelServer, max_request_bytes: int) -> APIRouter:
    router = APIRouter()
    metrics = server.metrics

    async def infer(request: Request, model: str, version: str | None) -> Response:
        start = time.perf_counter()
        loaded: LoadedVersion | None = None
        try:
            number = None if version is None else _parse_version(version)
            body = await read_body(request, max_request_bytes, hint="send fewer rows per request")
            parsed = kserve.decode_request(body, _header_length(request))
            del body  # freed before the compute (binary inputs keep viewing their bytes)
            if parsed.outputs is not None:
                _check_requested_outputs(server.resolve(model, number), parsed.outputs)
            loaded, future = server.submit(model, parsed.inputs, number)
            outputs = await asyncio.wrap_future(future)
            body, header_length = kserve.encode_response(
                loaded.name, loaded.version, outputs, parsed
            )
        except Exception as e:
            if status_of(e) == 500:
                logger.exception("inference on %s failed", model)
            # Unserved names a client made up must not become label values (cardinality).
            label = (
                _labels(loaded)
                if loaded is not None
                else (model if model in server.model_names() else "_unknown", "_none")
            )
            metrics.requests.labels(*label, str(status_of(e))).inc()
            return _error(e)
        metrics.requests.labels(*_labels(loaded), "200").inc()
        metrics.latency.labels(*_labels(loaded)).observe(time.perf_counter() - start)
        if header_length is None:
            return Response(body, media_type="application/json")
        return Response(
            body,
            media_type="application/octet-stream",
            headers={kserve.BINARY_HEADER: str(header_length)},
        )

    @router.post("/v2/models/{model}/infer")
    async def infer_latest(model: str, request: Request) -> Response:
        return await infer(request, model, None)

    @router.post("/v2/models/{model}/versions/{version}/infer")
    async def infer_version(model: str, version: str, request: Request) -> Response:
        return await infer(request, model, version)

    return router


def _header_length(request: Request) -> int | None:
    """The binary extension's JSON length, None when the header is absent."""
    value = request.headers.get(kserve.BINARY_HEADER)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise InvalidInputError(
            f"{kserve.BINARY_HEADER} must be the JSON part's length in bytes, got {value!r}"
        )
    return int(value)


def _check_requested_outputs(loaded: LoadedVersion, requested: list[str]) -> None:
    known = {s.name for s in loaded.signature.outputs}
    unknown = [n for n in requested if n not in known]
    if unknown:
        raise InvalidInputError(
            f"outputs {unknown} are not outputs of model {loaded.name!r}; expected {sorted(known)}"
        )


def _operations(server: ModelServer) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics")
    async def prometheus() -> Response:
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/v2/repository/failures")
    async def failures() -> Response:
        return Response(json.dumps(server.failures()), media_type="application/json")

    return router


def _labels(loaded: LoadedVersion) -> tuple[str, str]:
    return loaded.name, str(loaded.version)


ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class _CloseWhileDraining:
    """ASGI middleware: once `app_state.draining` is set, every response closes its connection.

    A keep-alive client whose request reaches a draining server gets its answer, with
    `Connection: close` telling it not to send on that connection again: the shutdown then
    closes connections that are done instead of cutting off requests already sent.
    """

    def __init__(self, app: ASGIApp, app_state: Any):
        self.app = app
        self.app_state = app_state

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing_when_draining(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and self.app_state.draining:
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_closing_when_draining)
