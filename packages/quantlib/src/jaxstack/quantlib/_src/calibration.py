"""Calibration methods: how the bound that maps to the largest code is chosen.

`absmax` keeps every value representable; `rms,k` clips at k standard deviations (root mean
square) and `percentile,p` at the p-th percentile of |x|, trading a little clipping of outliers
for finer steps everywhere else (the AQT/Qwix names and meanings).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxstack.quantlib._src.errors import RuleError

METHODS = ("absmax", "rms,K", "percentile,P")


def parse(spec: str, field: str) -> tuple[str, float]:
    """("absmax", 0) / ("rms", k) / ("percentile", p) from a rule's calibration string."""
    name, _, arg = spec.partition(",")
    if name == "absmax" and not arg:
        return name, 0.0
    if name in ("rms", "percentile") and arg:
        try:
            value = float(arg)
        except ValueError:
            value = -1.0
        ok = value > 0 if name == "rms" else 0 < value <= 100
        if ok:
            return name, value
    raise RuleError(f"{field}={spec!r} is not a calibration method; use one of {list(METHODS)}")


def bound_fn(spec: str) -> Callable[..., jax.Array]:
    """`bound(abs_x, axis, keepdims)`: the magnitude the largest code stands for."""
    name, arg = parse(spec, "calibration")
    if name == "absmax":
        return lambda a, axis, keepdims: jnp.max(a, axis=axis, keepdims=keepdims)
    if name == "rms":
        return lambda a, axis, keepdims: (
            arg * jnp.sqrt(jnp.mean(jnp.square(a), axis=axis, keepdims=keepdims))
        )
    return lambda a, axis, keepdims: jnp.percentile(a, arg, axis=axis, keepdims=keepdims)
