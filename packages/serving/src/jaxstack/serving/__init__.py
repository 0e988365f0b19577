"""jaxstack.serving: serve JAX models.

Model serving (this release): `export` a JAX function and its parameters as a versioned
StableHLO artifact, `load_artifact` it back (hash-checked), and serve a repository of them with
`ModelServer` (dynamic batching, hot reload) behind a KServe v2 REST app (`create_app`, `serve`,
the `jaxstack-serve-models` command). The LLM engine will live beside it.
"""

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.serving, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.errors": [
            "ArtifactError",
            "ConfigError",
            "Error",
            "ExportError",
            "InvalidInputError",
            "ModelNotFoundError",
            "QueueFullError",
            "ServerBusyError",
        ],
        "_src.llm.engine": ["EngineConfig", "LLMEngine"],
        "_src.llm.llm": ["LLM"],
        "_src.llm.outputs": ["CompletionOutput", "RequestOutput"],
        "_src.llm.sampling_params": ["SamplingParams"],
        "_src.llm.guided": ["StructuredOutput"],
        "_src.models.batcher": ["BatchStats", "DynamicBatcher"],
        "_src.models.cli": ["serve"],
        "_src.models.export": ["export"],
        "_src.models.http": ["create_app"],
        "_src.models.load": ["Artifact", "Signature", "TensorSpec", "load_artifact"],
        "_src.models.metrics": ["ServingMetrics"],
        "_src.models.repository": ["ModelConfig", "RepositoryConfig", "VersionPolicy"],
        "_src.models.server": ["LoadedVersion", "ModelServer"],
    },
)
