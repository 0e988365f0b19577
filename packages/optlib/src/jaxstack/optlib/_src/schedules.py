"""Learning-rate schedules from a ScheduleConfig, composed from Optax's own schedule functions.

Optax has warmup+cosine and the pieces for the rest (`linear_schedule`, `join_schedules`); only
the WSD decay shapes and inverse-sqrt are written here, as small jnp functions of the step.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from jaxstack.optlib._src.config import OptimizerConfig, ScheduleConfig


def build_schedule(
    config: OptimizerConfig | ScheduleConfig, peak_value: float | None = None
) -> optax.Schedule:
    """The learning-rate schedule of a recipe: a function step -> learning rate.

    Args:
      config: an OptimizerConfig (its `learning_rate` is the peak) or a bare ScheduleConfig.
      peak_value: the peak for a bare ScheduleConfig (default 1.0, i.e. a multiplier).

    Example:
      >>> cfg = OptimizerConfig(learning_rate=1e-3, schedule=ScheduleConfig(
      ...     "warmup_cosine", warmup_steps=100, total_steps=1000))
      >>> float(build_schedule(cfg)(100))
      0.001
    """
    if isinstance(config, OptimizerConfig):
        schedule, peak = config.schedule, config.learning_rate
    else:
        schedule, peak = config, 1.0
    if peak_value is not None:
        peak = peak_value
    return _BUILDERS[schedule.name](schedule, peak)


def _warmup(s: ScheduleConfig, peak: float) -> optax.Schedule:
    return optax.linear_schedule(s.init_lr_ratio * peak, peak, s.warmup)


def _constant(s: ScheduleConfig, peak: float) -> optax.Schedule:
    if s.warmup == 0:
        return optax.constant_schedule(peak)
    # The same function schedule-free AdamW uses for its own `warmup_steps`.
    return optax.warmup_constant_schedule(s.init_lr_ratio * peak, peak, s.warmup)


def _warmup_cosine(s: ScheduleConfig, peak: float) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=s.init_lr_ratio * peak,
        peak_value=peak,
        warmup_steps=s.warmup,
        decay_steps=s.total_steps,
        end_value=s.final_lr_ratio * peak,
    )


def _warmup_linear(s: ScheduleConfig, peak: float) -> optax.Schedule:
    decay = optax.linear_schedule(peak, s.final_lr_ratio * peak, s.total_steps - s.warmup)
    return optax.join_schedules([_warmup(s, peak), decay], [s.warmup])


def _wsd(s: ScheduleConfig, peak: float) -> optax.Schedule:
    end = s.final_lr_ratio * peak
    steps = s.decay_steps
    if s.decay_shape == "linear":
        decay = optax.linear_schedule(peak, end, steps)
    elif s.decay_shape == "cosine":
        decay = optax.cosine_decay_schedule(peak, steps, alpha=s.final_lr_ratio)
    else:

        def decay(count):
            progress = jnp.clip(jnp.asarray(count, jnp.float32) / steps, 0.0, 1.0)
            return peak - (peak - end) * jnp.sqrt(progress)

    stable_end = s.total_steps - steps
    return optax.join_schedules(
        [_warmup(s, peak), optax.constant_schedule(peak), decay], [s.warmup, stable_end]
    )


def _inverse_sqrt(s: ScheduleConfig, peak: float) -> optax.Schedule:
    timescale = max(s.warmup, 1)
    init = s.init_lr_ratio * peak

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        warm = init + (peak - init) * step / timescale
        decayed = peak * jnp.sqrt(timescale / jnp.maximum(step, timescale))
        return jnp.where(step < s.warmup, warm, decayed)

    return schedule


_BUILDERS = {
    "constant": _constant,
    "warmup_cosine": _warmup_cosine,
    "warmup_linear": _warmup_linear,
    "wsd": _wsd,
    "inverse_sqrt": _inverse_sqrt,
}
