"""The tolerance table every implementation is held to against the XLA reference, and the
forward-and-backward run that produces both sides.

Tolerances are per dtype, separately for outputs and gradients (gradients go through one more
reduction, and bf16 inputs round their products). Used by the package's tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    # dtype: {"fwd": (atol, rtol), "grad": (atol, rtol)}
    "float32": {"fwd": (2e-5, 2e-5), "grad": (1e-4, 1e-4)},
    "float16": {"fwd": (5e-3, 5e-3), "grad": (2e-2, 2e-2)},
    "bfloat16": {"fwd": (3e-2, 3e-2), "grad": (8e-2, 5e-2)},
}


def assert_close(actual, expected, kind: str = "fwd", dtype=None, what: str = "") -> None:
    """Raises AssertionError if `actual` differs from `expected` beyond the table's tolerance."""
    name = np.dtype(dtype if dtype is not None else np.asarray(expected).dtype).name
    atol, rtol = TOLERANCES[name][kind]
    a = np.asarray(actual, np.float32)
    e = np.asarray(expected, np.float32)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    assert np.all(np.isfinite(a)), f"{what}: non-finite values"
    np.testing.assert_allclose(a, e, atol=atol, rtol=rtol, err_msg=f"{what} ({name}, {kind})")


def vjp_against_xla(op, args, cot, impl, config=None, f32_reference=True):
    """((out, grads), (ref, ref_grads)): `op(*args, implementation=impl, interpret=True,
    config=config)` and `op(..., implementation="xla")` (on args cast to float32 when
    `f32_reference`), each pulled back with the one cotangent `cot` in its output's dtype (draw
    it in float32 and round it to the tested dtype, so both sides see the same numbers)."""

    def run(args, **kw):
        out, vjp = jax.vjp(lambda *a: op(*a, **kw), *args)
        return out, vjp(cot.astype(out.dtype))

    ref_args = [a.astype(jnp.float32) for a in args] if f32_reference else args
    return run(args, implementation=impl, interpret=True, config=config), run(
        ref_args, implementation="xla"
    )
