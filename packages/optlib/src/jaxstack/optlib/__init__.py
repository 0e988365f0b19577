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

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.optlib, or a command's --help, does not import JAX.
_EXPORTS = {
    "build_optimizer": "build",
    "scale_by_path_multipliers": "build",
    "chunked_cross_entropy_loss": "chunked_loss",
    "DEFAULT_MUON_EXCLUDE": "config",
    "DEFAULT_NO_DECAY": "config",
    "OPTIMIZERS": "config",
    "SCHEDULES": "config",
    "OptimizerConfig": "config",
    "ScheduleConfig": "config",
    "ParamEmaState": "ema",
    "param_ema": "ema",
    "ConfigError": "errors",
    "Error": "errors",
    "UnmatchedRegexWarning": "errors",
    "cross_entropy_loss": "losses",
    "param_paths": "paths",
    "build_schedule": "schedules",
    "current_learning_rate": "state",
    "ema_params": "state",
    "nonfinite_count": "state",
    "schedule_free_eval_params": "state",
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
