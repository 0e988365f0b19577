"""The KServe v2 REST front end of a `ModelServer` (FastAPI), plus Prometheus `/metrics`.

Handlers parse JSON themselves rather than through pydantic models: the error messages then
name the KServe field (`inputs[0].shape`), and the hot path skips a validation layer. Errors of
the package map to status codes: bad request 400, unknown model/version 404, full queue or
draining version 503 (with Retry-After); anything else is a 500 with its message, never a crash.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from jaxstack.serving._src.errors import (
    Error,
    InvalidInputError,
    ModelNotFoundError,
    ServerBusyError,
)
from jaxstack.serving._src.models import kserve
from jaxstack.serving._src.models.server import LoadedVersion, ModelServer

logger = logging.getLogger("jaxstack.serving.models")


class RequestTooLargeError(InvalidInputError):
    """The body is larger than the server accepts (HTTP 413)."""


_STATUS = {
    RequestTooLargeError: 413,
    InvalidInputError: 400,
    ModelNotFoundError: 404,
    ServerBusyError: 503,
}


def _status_of(error: BaseException) -> int:
    return next((code for cls, code in _STATUS.items() if isinstance(error, cls)), 500)


def _error(error: BaseException) -> JSONResponse:
    status = _status_of(error)
    message = str(error) if isinstance(error, Error) else f"{type(error).__name__}: {error}"
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _parse_version(version: str) -> int:
    if not version.isdigit():
        raise ModelNotFoundError(f"version {version!r} in the URL must be a positive integer")
    return int(version)


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


def create_app(server: ModelServer, *, max_request_bytes: int = 64 << 20) -> FastAPI:
    """A FastAPI app serving `server` (already started) over KServe v2 REST.

    Request bodies over `max_request_bytes` are refused with 413 before they are read.
    """
    app = FastAPI(title="jaxstack model server", docs_url=None, redoc_url=None)
    metrics = server.metrics

    @app.exception_handler(Error)
    async def _package_error(request: Request, error: Error) -> JSONResponse:
        return _error(error)

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "jaxstack-serving", "extensions": ["model_repository_polling"]}

    @app.get("/v2/health/live")
    async def live() -> dict[str, Any]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        return JSONResponse({"ready": server.ready}, status_code=200 if server.ready else 503)

    @app.get("/v2/models/{model}")
    async def model_metadata(model: str) -> dict[str, Any]:
        return _model_metadata(server.resolve(model), server.versions(model))

    @app.get("/v2/models/{model}/versions/{version}")
    async def version_metadata(model: str, version: str) -> dict[str, Any]:
        loaded = server.resolve(model, _parse_version(version))
        return _model_metadata(loaded, [loaded.version])

    @app.get("/v2/models/{model}/ready")
    async def model_ready(model: str) -> dict[str, Any]:
        server.resolve(model)
        return {"name": model, "ready": True}

    @app.get("/v2/models/{model}/versions/{version}/ready")
    async def version_ready(model: str, version: str) -> dict[str, Any]:
        server.resolve(model, _parse_version(version))
        return {"name": model, "version": version, "ready": True}

    async def infer(request: Request, model: str, version: int | None) -> Response:
        start = time.perf_counter()
        loaded: LoadedVersion | None = None
        try:
            declared = request.headers.get("content-length", "0")
            if declared.isdigit() and int(declared) > max_request_bytes:
                raise RequestTooLargeError(
                    f"request body of {declared} bytes exceeds the limit of {max_request_bytes}; "
                    "send fewer rows per request"
                )
            parsed = kserve.decode_request(await request.body())
            if parsed.outputs is not None:
                known = {s.name for s in server.resolve(model, version).signature.outputs}
                unknown = [n for n in parsed.outputs if n not in known]
                if unknown:
                    raise InvalidInputError(
                        f"outputs {unknown} are not outputs of model {model!r}; "
                        f"expected {sorted(known)}"
                    )
            loaded, future = server.submit(model, parsed.inputs, version)
            outputs = await asyncio.wrap_future(future)
            body = kserve.encode_response(
                loaded.name, loaded.version, parsed.id, outputs, parsed.outputs
            )
        except Exception as e:
            if _status_of(e) == 500:
                logger.exception("inference on %s failed", model)
            # Unserved names a client made up must not become label values (cardinality).
            label = (
                _labels(loaded)
                if loaded is not None
                else (model if model in server.model_names() else "_unknown", "_none")
            )
            metrics.requests.labels(*label, str(_status_of(e))).inc()
            return _error(e)
        metrics.requests.labels(*_labels(loaded), "200").inc()
        metrics.latency.labels(*_labels(loaded)).observe(time.perf_counter() - start)
        return Response(body, media_type="application/json")

    @app.post("/v2/models/{model}/infer")
    async def infer_latest(model: str, request: Request) -> Response:
        return await infer(request, model, None)

    @app.post("/v2/models/{model}/versions/{version}/infer")
    async def infer_version(model: str, version: str, request: Request) -> Response:
        try:
            number = _parse_version(version)
        except ModelNotFoundError as e:
            return _error(e)
        return await infer(request, model, number)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v2/repository/failures")
    async def failures() -> Response:
        return Response(json.dumps(server.failures()), media_type="application/json")

    return app


def _labels(loaded: LoadedVersion) -> tuple[str, str]:
    return loaded.name, str(loaded.version)
