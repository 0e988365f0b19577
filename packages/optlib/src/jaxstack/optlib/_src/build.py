"""build_optimizer: one OptimizerConfig -> one plain `optax.GradientTransformation`.

The chain, from the outside in (each layer only when the config asks for it):

    partition(frozen -> set_to_zero)        frozen leaves: zero update, no state at all
      apply_if_finite                       skip a NaN/Inf gradient, count it
        MultiSteps(k)                       average k micro-batch gradients (k=1: absent);
                                            optlib's one way to accumulate gradients
          chain(
            clip_by_global_norm,            the norm of the trainable gradients only
            inject_hyperparams(core)(lr=schedule),   the optimiser; current lr in its state
            scale by per-path lr multiplier,
            param_ema,                      EMA of the resulting parameters
          )

Frozen leaves are split off first so that they cost no accumulator, no moment and no EMA
memory (the LoRA case) and do not count in the clipping norm or the finiteness check.
The finiteness check sits outside MultiSteps so that a NaN micro-batch is dropped before it
reaches the accumulator: inside, one NaN would poison the running mean for good (MultiSteps
resets it by multiplying with 0, and NaN * 0 is NaN).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import optax
from optax import contrib

from jaxstack.optlib._src.config import OptimizerConfig
from jaxstack.optlib._src.ema import param_ema
from jaxstack.optlib._src.optimizers import Routing, core_factory
from jaxstack.optlib._src.paths import (
    compile_regexes,
    first_match,
    param_paths,
    path_labels,
    path_to_str,
    warn_unmatched,
)
from jaxstack.optlib._src.schedules import build_schedule

PyTree = Any


def build_optimizer(
    config: OptimizerConfig, params: PyTree | None = None
) -> optax.GradientTransformation:
    """The recipe as a plain Optax transformation: `init(params)`, `update(grads, state, params)`.

    Args:
      config: the recipe (an OptimizerConfig, or a dict for `OptimizerConfig.from_dict`).
      params: the parameter PyTree (a dict or an NNX State; arrays or ShapeDtypeStructs). Only
        its paths are read: to warn (`UnmatchedRegexWarning`) about config regexes that match
        no parameter. Masks are resolved from the params passed to `init`/`update`, so the
        transformation also works on other trees with the same paths.

    Returns:
      An `optax.GradientTransformation` (or `...ExtraArgs`), nothing jaxstack-specific: use it
      with `optax.apply_updates`, `nnx.Optimizer`, or any Optax-based loop.

    Example:
      >>> params = {"dense": {"kernel": jnp.ones((4, 4)), "bias": jnp.zeros(4)}}
      >>> tx = build_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3,
      ...                                      weight_decay=0.1, clip_norm=1.0), params)
      >>> state = tx.init(params)
      >>> updates, state = tx.update(params, state, params)
      >>> float(current_learning_rate(state))
      0.001
    """
    if not isinstance(config, OptimizerConfig):
        config = OptimizerConfig.from_dict(config)
    if params is not None:
        _warn_unmatched_regexes(config, params)

    no_decay = compile_regexes(config.no_decay_regexes, "weight_decay_mask")
    decay_mask = path_labels(lambda path: first_match(path, no_decay) is None)
    muon_labels, muon_dims = _muon_routing(config) if config.name == "muon" else (None, None)
    schedule = build_schedule(config)
    factory = core_factory(config, Routing(decay_mask, muon_labels, muon_dims, schedule))
    core = optax.inject_hyperparams(factory)(learning_rate=schedule)

    links = []
    if config.clip_norm is not None:
        links.append(optax.clip_by_global_norm(config.clip_norm))
    links.append(core)
    if config.lr_multipliers:
        links.append(scale_by_path_multipliers(config.lr_multipliers))
    if config.ema_decay is not None:
        links.append(param_ema(config.ema_decay))
    tx = links[0] if len(links) == 1 else optax.chain(*links)

    if config.accumulate_steps > 1:
        tx = optax.MultiSteps(
            tx, every_k_schedule=config.accumulate_steps
        ).gradient_transformation()
    if config.skip_nonfinite:
        tx = optax.apply_if_finite(tx, max_consecutive_errors=config.max_consecutive_nonfinite)
    if config.frozen:
        frozen = compile_regexes(config.frozen, "frozen")
        labels = path_labels(
            lambda path: "frozen" if first_match(path, frozen) is not None else "trainable"
        )
        tx = optax.partition({"trainable": tx, "frozen": optax.set_to_zero()}, labels)
    return tx


def scale_by_path_multipliers(multipliers: dict[str, float]) -> optax.GradientTransformation:
    """Scales each update by the factor of the first regex matching its path (else 1).

    Applied to the final updates, so it scales the whole step of that parameter, decoupled
    weight decay included: exactly a per-parameter learning-rate multiplier for optimisers
    whose step is linear in the learning rate (all but schedule-free, where it scales the step).
    """
    items = list(multipliers.items())
    regexes = compile_regexes([k for k, _ in items], "lr_multipliers")

    def update_fn(updates, state, params=None):
        del params

        def scale(key_path, update):
            index = first_match(path_to_str(key_path), regexes)
            return update if index is None else update * items[index][1]

        return jax.tree_util.tree_map_with_path(scale, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _muon_routing(config: OptimizerConfig):
    """Labels ('muon' / 'adam') and muon dimension numbers, both as functions of the params."""
    exclude = compile_regexes(config.muon_exclude_regexes, "muon_exclude")
    dims_items = list(config.muon_dimension_numbers.items())
    dims_regexes = [re.compile(k) for k, _ in dims_items]

    def dims_of(path: str, leaf: Any) -> contrib.MuonDimensionNumbers | None:
        if first_match(path, exclude) is not None:
            return None
        index = first_match(path, dims_regexes)
        if index is not None:
            value = dims_items[index][1]
            return None if value is None else contrib.MuonDimensionNumbers(*value)
        return contrib.MuonDimensionNumbers() if len(leaf.shape) == 2 else None

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda kp, x: "adam" if dims_of(path_to_str(kp), x) is None else "muon", params
        )

    def dims(params):
        # Called by contrib.muon on the muon subtree only (other leaves are MaskedNodes, which
        # tree_map leaves alone), so every leaf here has dimension numbers.
        return jax.tree_util.tree_map_with_path(lambda kp, x: dims_of(path_to_str(kp), x), params)

    return labels, (dims if dims_items else None)


def _warn_unmatched_regexes(config: OptimizerConfig, params: PyTree) -> None:
    paths = jax.tree.leaves(param_paths(params))
    if config.weight_decay_mask is not None:
        warn_unmatched(paths, config.weight_decay_mask, "weight_decay_mask")
    warn_unmatched(paths, list(config.lr_multipliers), "lr_multipliers")
    warn_unmatched(paths, config.frozen, "frozen")
    if config.muon_exclude is not None:
        warn_unmatched(paths, config.muon_exclude, "muon_exclude")
    warn_unmatched(paths, list(config.muon_dimension_numbers), "muon_dimension_numbers")
