from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernlib_testutil import assert_close

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

    def run(x, **kw):
        f = lambda x: kernlib.quantized_matmul(x, qt, **kw)
        out, vjp = jax.vjp(f, x)
        return out, vjp(cot.astype(out.dtype))[0]

    out, dx = run(x, implementation=impl, interpret=True, config=config)
    ref, rdx = run(x, implementation="xla")
    assert out.shape == (*lead, n) and out.dtype == x.dtype
    assert_close(out, ref, "fwd", dtype, f"{impl} out")
    assert_close(dx, rdx, "grad", dtype, f"{impl} dx")


@pytest.fixture
def qmm_compare():
    return compare


@pytest.fixture
def quantized_weight():
    return make_weight
