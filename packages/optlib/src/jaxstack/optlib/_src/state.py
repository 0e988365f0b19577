"""Reading a recipe's optimiser state: current learning rate, skipped steps, EMA parameters.

The state of a built recipe is a plain nest of Optax state NamedTuples whose shape depends on
the config (MultiSteps, partition, apply_if_finite...). These readers find the piece they need
structurally, so the caller never spells out the nesting.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax import contrib

from jaxstack.optlib._src.ema import ParamEmaState
from jaxstack.optlib._src.errors import Error
from jaxstack.optlib._src.paths import path_to_str


def _find(state: Any, predicate) -> list[Any]:
    return [
        node
        for node in jax.tree.leaves(state, is_leaf=lambda x: predicate(x) or x is None)
        if predicate(node)
    ]


def _unbox(x: Any) -> Any:
    """The array inside a box such as nnx.Optimizer's `OptArray` (itself a one-leaf PyTree)."""
    leaves = jax.tree.leaves(x)
    return leaves[0] if len(leaves) == 1 else x


def _is_injected(node: Any) -> bool:
    hyperparams = getattr(node, "hyperparams", None)
    return isinstance(hyperparams, dict) and "learning_rate" in hyperparams


def current_learning_rate(opt_state: Any) -> jax.Array | None:
    """The learning rate the latest update used (from `inject_hyperparams` state), or None.

    With `accumulate_steps > 1` it is the learning rate of the latest real (k-th) update.
    """
    found = _find(opt_state, _is_injected)
    return _unbox(found[0].hyperparams["learning_rate"]) if found else None


def nonfinite_count(opt_state: Any) -> jax.Array | None:
    """How many updates `skip_nonfinite` has skipped in total (None if it is off)."""
    found = _find(opt_state, lambda n: isinstance(n, optax.ApplyIfFiniteState))
    return _unbox(found[0].total_notfinite) if found else None


def _by_path(tree: Any, params: Any) -> Any:
    """`params`' tree (and box types) holding `tree`'s leaf of the same path where it has one.

    Matching by path rather than by structure lets a state that wraps its arrays differently
    (`nnx.Optimizer` keeps them in `OptVariable`s) or that skips frozen leaves (optax's
    `MaskedNode`) line up with the params; the params fill in what the state lacks.
    """
    found = {path_to_str(kp): leaf for kp, leaf in jax.tree_util.tree_leaves_with_path(tree)}
    return jax.tree_util.tree_map_with_path(lambda kp, p: found.get(path_to_str(kp), p), params)


def ema_params(opt_state: Any, params: Any = None) -> Any:
    """The EMA of the parameters kept by `ema_decay`.

    Frozen parameters keep no EMA (they never change): pass `params` to get a tree shaped like
    `params` (an NNX State stays an NNX State) with their current values filled in.
    """
    found = _find(opt_state, lambda n: isinstance(n, ParamEmaState))
    if not found:
        raise Error("this optimiser state keeps no parameter EMA; set ema_decay in the config")
    ema = found[0].ema
    return ema if params is None else _by_path(ema, params)


def schedule_free_eval_params(opt_state: Any, params: Any) -> Any:
    """The parameters to evaluate with under schedule-free AdamW (the averaged iterate x).

    Training steps run at y (the params you hold); `optax.contrib.schedule_free_eval_params`
    recovers x, found here at whatever depth the recipe put the schedule-free state.
    """
    found = _find(opt_state, lambda n: isinstance(n, contrib.ScheduleFreeState))
    if not found:
        raise Error("this optimiser state is not schedule-free; use name='schedule_free_adamw'")
    state = found[0]
    z = _by_path(state.z, params)
    b1 = _unbox(state.b1)
    return jax.tree.map(
        lambda y, zi: ((y - (1.0 - b1) * zi) / b1).astype(jnp.asarray(y).dtype), params, z
    )
