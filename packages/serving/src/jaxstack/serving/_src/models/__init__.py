"""Non-LLM model serving: StableHLO artifacts, a model repository, dynamic batching, KServe v2.

The modules, in the order an artifact and then a request meet them:

- `artifact_format`, `export`, `load`: one directory per model version holding the computation
  (`jax.export`, StableHLO with a symbolic batch dimension), the weights (safetensors), the
  signature and metadata (JSON) and a manifest of content hashes.
- `repository`: the `<model>/<version>/` tree, its config and per-model version policy.
- `server`: the loaded versions, hot reload and draining; `batcher`: dynamic batching.
- `kserve` (JSON tensors), `validate` (against the signature), `http` (FastAPI routes),
  `metrics` (Prometheus) and `cli` (`jaxstack-serve-models`) put it on the wire.
"""
