import jax
import jax.numpy as jnp
import pytest
from kernlib_testutil import assert_close, vjp_against_xla

from jaxstack import kernlib


def compare(impl, m, k, n, sizes, dtype="float32", config=None):
    kl, kr, kc = jax.random.split(jax.random.key(1), 3)
    lhs = jax.random.normal(kl, (m, k), dtype)
    rhs = (jax.random.normal(kr, (len(sizes), k, n), jnp.float32) / k**0.5).astype(dtype)
    gs = jnp.asarray(sizes, jnp.int32)

    # one cotangent for both sides: drawn in f32, rounded to the tested dtype
    cot = jax.random.normal(kc, (m, n), jnp.float32).astype(dtype)

    op = lambda a, b, **kw: kernlib.grouped_matmul(a, b, gs, **kw)
    (out, (dl, dr)), (ref, (rdl, rdr)) = vjp_against_xla(op, (lhs, rhs), cot, impl, config)
    assert out.dtype == lhs.dtype
    assert_close(out, ref, "fwd", dtype, f"{impl} out")
    assert_close(dl, rdl, "grad", dtype, f"{impl} dlhs")
    assert_close(dr, rdr, "grad", dtype, f"{impl} drhs")
    return out


@pytest.fixture
def gmm_compare():
    return compare


# group sizes: empty groups, a group spanning tiles, all rows in one group, a short tail
SIZES = [[10, 0, 25, 5], [0, 0, 0, 0], [50, 0, 0, 0], [3, 7, 0, 30, 0, 1]]
