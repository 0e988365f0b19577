"""jaxstack.trainer: a foundation-model training harness on the jaxstack packages.

It composes nnlib (model), optlib (optimiser and losses), datalib (data) and ckptlib
(checkpoints) into one training loop with YAML configs, device meshes and logical-axis sharding,
MFU and goodput accounting, JSON-lines/TensorBoard metrics, an HTML report and the
`jaxstack-train` command. See docs/trainer.md.

Public names load on first use (PEP 562), so `jaxstack-train` can install its SIGTERM/SIGINT
handler before JAX is imported: a signal during the seconds of start-up is answered at once.
"""

import lazy_loader

# Public names load on first use (PEP 562), so `jaxstack-train` can install its signal
# handler before JAX is imported.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.config": [
            "CheckpointSection",
            "Config",
            "DataConfig",
            "EvalSection",
            "LogSection",
            "MeshConfig",
            "TrainSection",
            "QuantSection",
            "list_configs",
            "load_config",
            "read_config_tree",
            "Section",
            "apply_overrides",
            "parse_override",
        ],
        "_src.cli": ["add_xla_flags", "main"],
        "_src.dry_run": ["dry_run"],
        "_src.aot": ["AotError", "TpuSlice", "aot_train_compile"],
        "_src.errors": [
            "ConfigError",
            "DataError",
            "Error",
            "MeshError",
            "ResumeError",
            "report_error",
            "report_warnings",
        ],
        "_src.goodput": ["GoodputTracker"],
        "_src.session": ["enable_compile_cache", "loss_fn_for"],
        "_src.loop": ["TrainResult", "train"],
        "_src.mesh": [
            "DEFAULT_RULES",
            "batch_sharding",
            "build_mesh",
            "logical_rules",
            "param_shardings",
            "resolve_axes",
            "state_shardings",
        ],
        "_src.metrics_log": ["MetricsLog", "read_jsonl"],
        "_src.report": ["write_report"],
        "_src.step": ["make_eval_step", "make_loss_fn", "make_train_step"],
    },
)
