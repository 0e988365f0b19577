"""The one exception family of jaxstack.serving.

Every error the package raises on purpose is an `Error`, so a caller can catch the package's
failures without catching bugs. The HTTP layer maps each subclass to one status code.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every error jaxstack.serving raises on purpose."""


class ExportError(Error):
    """A function, its parameters or its example inputs cannot be exported as an artifact."""


class ArtifactError(Error):
    """An artifact directory is partial, tampered with, or made for another platform."""


class InvalidInputError(Error):
    """A request is malformed: wrong input name, shape, datatype or data (HTTP 400)."""


class InvalidFieldError(InvalidInputError):
    """One named field of a request has a bad value (HTTP 400; `param` names the field, as
    OpenAI's error bodies do)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class ModelNotFoundError(Error):
    """The named model or version is not served (HTTP 404)."""


class ServerBusyError(Error):
    """A bounded queue is full or a model version is draining; retry later (HTTP 503)."""


class ConfigError(Error):
    """A serving configuration file or option has a bad value."""


class QueueFullError(ServerBusyError):
    """The LLM engine's waiting queue is at its limit; retry later (HTTP 429)."""
