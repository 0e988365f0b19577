"""jaxstack.trainer: a foundation-model training harness on the jaxstack packages.

It composes nnlib (model), optlib (optimiser and losses), datalib (data) and ckptlib
(checkpoints) into one training loop with YAML configs, device meshes and logical-axis sharding,
MFU and goodput accounting, JSON-lines/TensorBoard metrics, an HTML report and the
`jaxstack-train` command. See docs/trainer.md.

Public names load on first use (PEP 562), so `jaxstack-train` can install its SIGTERM/SIGINT
handler before JAX is imported: a signal during the seconds of start-up is answered at once.
"""

import importlib
from typing import Any

# public name -> the private module that defines it
_EXPORTS = {
    "CheckpointSection": "config",
    "Config": "config",
    "DataConfig": "config",
    "EvalSection": "config",
    "LogSection": "config",
    "MeshConfig": "config",
    "TrainSection": "config",
    "QuantSection": "config",
    "list_configs": "config",
    "load_config": "config",
    "read_config_tree": "config",
    "Section": "config",
    "apply_overrides": "config",
    "parse_override": "config",
    "read_yaml_file": "config",
    "validate_config": "config",
    "main": "cli",
    "dry_run": "dry_run",
    "AotError": "aot",
    "TpuSlice": "aot",
    "aot_train_compile": "aot",
    "ConfigError": "errors",
    "DataError": "errors",
    "Error": "errors",
    "MeshError": "errors",
    "ResumeError": "errors",
    "report_error": "errors",
    "GoodputTracker": "goodput",
    "TrainResult": "loop",
    "train": "loop",
    "DEFAULT_RULES": "mesh",
    "batch_sharding": "mesh",
    "build_mesh": "mesh",
    "logical_rules": "mesh",
    "param_shardings": "mesh",
    "resolve_axes": "mesh",
    "state_shardings": "mesh",
    "MetricsLog": "metrics_log",
    "read_jsonl": "metrics_log",
    "write_report": "report",
    "make_eval_step": "step",
    "make_loss_fn": "step",
    "make_train_step": "step",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jaxstack.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"jaxstack.trainer._src.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
