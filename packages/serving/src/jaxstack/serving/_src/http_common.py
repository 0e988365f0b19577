"""HTTP conventions shared by the model server and the LLM server.

- `read_body` enforces the request-size limit while the body streams in, so a client that
  sends no Content-Length (chunked) or a false one cannot make the server buffer more than
  the limit.
- `status_of` maps the package's errors to HTTP status codes, one table for both servers.
"""

from __future__ import annotations

from fastapi import Request

from jaxstack.serving._src.errors import (
    InvalidInputError,
    ModelNotFoundError,
    QueueFullError,
    ServerBusyError,
)


class RequestTooLargeError(InvalidInputError):
    """The body is larger than the server accepts (HTTP 413)."""


class AuthenticationError(InvalidInputError):
    """The request lacks the server's API key (HTTP 401)."""


_STATUS = (
    (RequestTooLargeError, 413),
    (AuthenticationError, 401),
    (InvalidInputError, 400),
    (ModelNotFoundError, 404),
    (QueueFullError, 429),
    (ServerBusyError, 503),
)


def status_of(error: BaseException) -> int:
    """The HTTP status of an error: 4xx for the package's request errors, else 500."""
    return next((code for cls, code in _STATUS if isinstance(error, cls)), 500)


async def read_body(request: Request, limit: int, *, hint: str = "send a smaller request") -> bytes:
    """The request body, refused (RequestTooLargeError, ending with `hint`) as soon as more
    than `limit` bytes have arrived. Content-Length is checked first, but a chunked body has
    none: the limit is counted while reading."""
    declared = request.headers.get("content-length", "")
    too_large = f"request body exceeds the limit of {limit} bytes; {hint}"
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(too_large)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(too_large)
        chunks.append(chunk)
    return b"".join(chunks)
