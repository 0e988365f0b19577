"""jaxstack.serving: serve JAX models.

Model serving (this release): `export` a JAX function and its parameters as a versioned
StableHLO artifact, `load_artifact` it back (hash-checked), and serve a repository of them with
`ModelServer` (dynamic batching, hot reload) behind a KServe v2 REST app (`create_app`, `serve`,
the `jaxstack-serve-models` command). The LLM engine will live beside it.
"""

from jaxstack.serving._src.errors import (
    ArtifactError,
    ConfigError,
    Error,
    ExportError,
    InvalidInputError,
    ModelNotFoundError,
    QueueFullError,
    ServerBusyError,
)
from jaxstack.serving._src.llm.engine import EngineConfig, LLMEngine
from jaxstack.serving._src.llm.llm import LLM
from jaxstack.serving._src.llm.outputs import CompletionOutput, RequestOutput
from jaxstack.serving._src.llm.sampling_params import SamplingParams
from jaxstack.serving._src.models.batcher import BatchStats, DynamicBatcher
from jaxstack.serving._src.models.cli import serve
from jaxstack.serving._src.models.export import export
from jaxstack.serving._src.models.http import create_app
from jaxstack.serving._src.models.load import Artifact, Signature, TensorSpec, load_artifact
from jaxstack.serving._src.models.metrics import ServingMetrics
from jaxstack.serving._src.models.repository import ModelConfig, RepositoryConfig, VersionPolicy
from jaxstack.serving._src.models.server import LoadedVersion, ModelServer

__all__ = [
    "LLM",
    "Artifact",
    "ArtifactError",
    "BatchStats",
    "CompletionOutput",
    "ConfigError",
    "DynamicBatcher",
    "EngineConfig",
    "Error",
    "ExportError",
    "InvalidInputError",
    "LLMEngine",
    "LoadedVersion",
    "ModelConfig",
    "ModelNotFoundError",
    "ModelServer",
    "QueueFullError",
    "RepositoryConfig",
    "RequestOutput",
    "SamplingParams",
    "ServerBusyError",
    "ServingMetrics",
    "Signature",
    "TensorSpec",
    "VersionPolicy",
    "create_app",
    "export",
    "load_artifact",
    "serve",
]
