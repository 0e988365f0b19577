from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernlib_testutil import assert_close, vjp_against_xla

from jaxstack import kernlib


class QuantizedTensor(NamedTuple):
    """Stands in for quantlib's PyTree node: kernlib only reads these attributes."""

    values: Any
    scales: Any
    zero_points: Any
    dtype: Any
    shape: tuple


def make_weight(k, n, bits, tile, symmetric, dtype="float32", seed=0):
    w = np.asarray(jax.random.normal(jax.random.key(seed), (k, n))) / np.sqrt(k)
    values, scales, zp = kernlib.quantize(w, bits=bits, tile=tile, symmetric=symmetric)
    zp = None if zp is None else zp.astype(dtype)
    return QuantizedTensor(values, scales.astype(dtype), zp, jnp.dtype(dtype), (k, n)), w


def compare(impl, lead, k, n, bits, tile, symmetric, dtype="float32", config=None):
    qt, _ = make_weight(k, n, bits, tile, symmetric, dtype)
    x = jax.random.normal(jax.random.key(3), (*lead, k), dtype)

    # one cotangent for both sides: drawn in f32, rounded to the tested dtype
    cot = jax.random.normal(jax.random.key(4), (*lead, n), jnp.float32).astype(dtype)

    op = lambda x, **kw: kernlib.quantized_matmul(x, qt, **kw)
    # the weight is the same integers either way: the reference runs at x's dtype
    (out, (dx,)), (ref, (rdx,)) = vjp_against_xla(op, (x,), cot, impl, config, False)
    assert out.shape == (*lead, n) and out.dtype == x.dtype
    assert_close(out, ref, "fwd", dtype, f"{impl} out")
    assert_close(dx, rdx, "grad", dtype, f"{impl} dx")


@pytest.fixture
def qmm_compare():
    return compare


@pytest.fixture
def quantized_weight():
    return make_weight
