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

from jaxstack.optlib._src.build import build_optimizer, scale_by_path_multipliers
from jaxstack.optlib._src.chunked_loss import chunked_cross_entropy_loss
from jaxstack.optlib._src.config import (
    DEFAULT_MUON_EXCLUDE,
    DEFAULT_NO_DECAY,
    OPTIMIZERS,
    SCHEDULES,
    OptimizerConfig,
    ScheduleConfig,
)
from jaxstack.optlib._src.ema import ParamEmaState, param_ema
from jaxstack.optlib._src.errors import ConfigError, Error, UnmatchedRegexWarning
from jaxstack.optlib._src.losses import cross_entropy_loss
from jaxstack.optlib._src.paths import param_paths
from jaxstack.optlib._src.schedules import build_schedule
from jaxstack.optlib._src.state import (
    current_learning_rate,
    ema_params,
    nonfinite_count,
    schedule_free_eval_params,
)

__all__ = [
    "DEFAULT_MUON_EXCLUDE",
    "DEFAULT_NO_DECAY",
    "OPTIMIZERS",
    "SCHEDULES",
    "ConfigError",
    "Error",
    "OptimizerConfig",
    "ParamEmaState",
    "ScheduleConfig",
    "UnmatchedRegexWarning",
    "build_optimizer",
    "build_schedule",
    "chunked_cross_entropy_loss",
    "cross_entropy_loss",
    "current_learning_rate",
    "ema_params",
    "nonfinite_count",
    "param_ema",
    "param_paths",
    "scale_by_path_multipliers",
    "schedule_free_eval_params",
]
