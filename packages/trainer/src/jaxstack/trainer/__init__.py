"""jaxstack.trainer: a foundation-model training harness on the jaxstack packages.

It composes nnlib (model), optlib (optimiser and losses), datalib (data) and ckptlib
(checkpoints) into one training loop with YAML configs, device meshes and logical-axis sharding,
MFU and goodput accounting, JSON-lines/TensorBoard metrics, an HTML report and the
`jaxstack-train` command. See docs/trainer.md.
"""

from jaxstack.trainer._src.cli import main
from jaxstack.trainer._src.config import (
    CheckpointSection,
    Config,
    DataConfig,
    EvalSection,
    LogSection,
    MeshConfig,
    TrainSection,
    list_configs,
    load_config,
    parse_override,
)
from jaxstack.trainer._src.dry_run import dry_run
from jaxstack.trainer._src.errors import ConfigError, DataError, Error, MeshError
from jaxstack.trainer._src.goodput import GoodputTracker
from jaxstack.trainer._src.loop import TrainResult, train
from jaxstack.trainer._src.mesh import (
    DEFAULT_RULES,
    batch_sharding,
    build_mesh,
    logical_rules,
    param_shardings,
    resolve_axes,
    state_shardings,
)
from jaxstack.trainer._src.metrics_log import read_jsonl
from jaxstack.trainer._src.peak import DevicePeak, device_peak, measure_matmul_peak
from jaxstack.trainer._src.report import write_report
from jaxstack.trainer._src.step import make_eval_step, make_loss_fn, make_train_step

__all__ = [
    "DEFAULT_RULES",
    "CheckpointSection",
    "Config",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DevicePeak",
    "Error",
    "EvalSection",
    "GoodputTracker",
    "LogSection",
    "MeshConfig",
    "MeshError",
    "TrainResult",
    "TrainSection",
    "batch_sharding",
    "build_mesh",
    "device_peak",
    "dry_run",
    "list_configs",
    "load_config",
    "logical_rules",
    "main",
    "make_eval_step",
    "make_loss_fn",
    "make_train_step",
    "measure_matmul_peak",
    "param_shardings",
    "parse_override",
    "read_jsonl",
    "resolve_axes",
    "state_shardings",
    "train",
    "write_report",
]
