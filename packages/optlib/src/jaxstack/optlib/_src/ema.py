"""An exponential moving average of the parameters, as an Optax transformation.

`optax.ema` averages *updates*; evaluation wants an average of the *parameters*. This
transformation leaves the updates untouched and keeps `ema <- decay * ema + (1 - decay) *
(params + updates)` in its state, so it must be the last link of a chain (it sees the final
updates) and needs `params` in `update`. Low-precision parameters are averaged in float32:
with decay 0.999 a bfloat16 average would round every increment away.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxstack.optlib._src.errors import Error


class ParamEmaState(NamedTuple):
    """State of `param_ema`: the averaged parameters (same tree as the params)."""

    ema: Any


def _ema_dtype(dtype: Any) -> Any:
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.promote_types(dtype, jnp.float32)
    return dtype


def param_ema(decay: float) -> optax.GradientTransformation:
    """Tracks an EMA of the parameters the updates lead to; updates pass through unchanged.

    Example:
      >>> tx = optax.chain(optax.sgd(0.1), param_ema(0.9))
    """

    def init_fn(params):
        return ParamEmaState(
            ema=jax.tree.map(lambda p: jnp.asarray(p, _ema_dtype(p.dtype)), params)
        )

    def update_fn(updates, state, params=None):
        if params is None:
            raise Error("param_ema needs params: call tx.update(grads, opt_state, params)")
        new_params = optax.apply_updates(params, updates)
        ema = jax.tree.map(
            lambda e, p: (decay * e + (1.0 - decay) * p.astype(e.dtype)).astype(e.dtype),
            state.ema,
            new_params,
        )
        return updates, ParamEmaState(ema=ema)

    return optax.GradientTransformation(init_fn, update_fn)
