"""Declarative optimiser recipes, masks, schedules, accumulation and losses that produce plain
Optax transformations.

    cfg = OptimizerConfig.from_dict({"name": "adamw", "learning_rate": 3e-4, "weight_decay": 0.1,
                                     "clip_norm": 1.0, "schedule": {"name": "warmup_cosine",
                                     "warmup_steps": 100, "total_steps": 10_000}})
    tx = build_optimizer(cfg, params)          # a plain optax.GradientTransformation
    opt_state = tx.init(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    lr = current_learning_rate(opt_state)

Parameters are addressed by `/`-joined paths (`layers/0/attn/q_proj/kernel`) of any PyTree, a
dict or a Flax NNX State alike; masks, multipliers and frozen sets are regexes over them.
"""

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.optlib, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.build": ["build_optimizer", "scale_by_path_multipliers"],
        "_src.chunked_loss": ["chunked_cross_entropy_loss"],
        "_src.config": [
            "DEFAULT_MUON_EXCLUDE",
            "DEFAULT_NO_DECAY",
            "OPTIMIZERS",
            "SCHEDULES",
            "OptimizerConfig",
            "ScheduleConfig",
        ],
        "_src.config_model": [
            "ConfigModel",
            "PositionalConfigModel",
            "load_yaml",
            "read_yaml_file",
        ],
        "_src.ema": ["ParamEmaState", "param_ema"],
        "_src.errors": ["ConfigError", "Error", "UnmatchedRegexWarning"],
        "_src.losses": ["cross_entropy_loss"],
        "_src.paths": ["param_paths"],
        "_src.schedules": ["build_schedule"],
        "_src.state": [
            "current_learning_rate",
            "ema_params",
            "nonfinite_count",
            "schedule_free_eval_params",
        ],
    },
)
