import jax
import jax.numpy as jnp
import pytest
from kernlib_testutil import assert_close, vjp_against_xla

from jaxstack import kernlib


def compare(impl, shape, dtype="float32", config=None, **options):
    kx, kw, kc = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, shape, dtype)
    w = (1 + 0.2 * jax.random.normal(kw, shape[-1:], jnp.float32)).astype(dtype)

    # one cotangent for both sides: drawn in f32, rounded to the tested dtype
    cot = jax.random.normal(kc, shape, jnp.float32).astype(dtype)

    op = lambda x, w, **kw: kernlib.rms_norm(x, w, **options, **kw)
    (out, (dx, dw)), (ref, (rdx, rdw)) = vjp_against_xla(op, (x, w), cot, impl, config)
    assert out.dtype == x.dtype
    assert_close(out, ref, "fwd", dtype, f"{impl} y")
    assert_close(dx, rdx, "grad", dtype, f"{impl} dx")
    # dweight sums over every row: tolerance scales with the row count
    assert_close(dw / x.size * shape[-1], rdw / x.size * shape[-1], "grad", dtype, f"{impl} dw")


@pytest.fixture
def rms_compare():
    return compare
