"""jaxstack.serving: serve JAX models.

Model serving (this release): `export` a JAX function and its parameters as a versioned
StableHLO artifact, `load_artifact` it back (hash-checked), and serve a repository of them with
`ModelServer` (dynamic batching, hot reload) behind a KServe v2 REST app (`create_app`, `serve`,
the `jaxstack-serve-models` command). The LLM engine will live beside it.
"""

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.serving, or a command's --help, does not import JAX.
_EXPORTS = {
    "ArtifactError": "errors",
    "ConfigError": "errors",
    "Error": "errors",
    "ExportError": "errors",
    "InvalidInputError": "errors",
    "ModelNotFoundError": "errors",
    "QueueFullError": "errors",
    "ServerBusyError": "errors",
    "EngineConfig": "llm.engine",
    "LLMEngine": "llm.engine",
    "LLM": "llm.llm",
    "CompletionOutput": "llm.outputs",
    "RequestOutput": "llm.outputs",
    "SamplingParams": "llm.sampling_params",
    "StructuredOutput": "llm.guided",
    "BatchStats": "models.batcher",
    "DynamicBatcher": "models.batcher",
    "serve": "models.cli",
    "export": "models.export",
    "create_app": "models.http",
    "Artifact": "models.load",
    "Signature": "models.load",
    "TensorSpec": "models.load",
    "load_artifact": "models.load",
    "ServingMetrics": "models.metrics",
    "ModelConfig": "models.repository",
    "RepositoryConfig": "models.repository",
    "VersionPolicy": "models.repository",
    "LoadedVersion": "models.server",
    "ModelServer": "models.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}._src.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
