import jax
import jax.numpy as jnp
import pytest
from kernlib_testutil import assert_close

from jaxstack import kernlib


def compare(impl, m, k, n, sizes, dtype="float32", config=None):
    kl, kr, kc = jax.random.split(jax.random.key(1), 3)
    lhs = jax.random.normal(kl, (m, k), dtype)
    rhs = (jax.random.normal(kr, (len(sizes), k, n), jnp.float32) / k**0.5).astype(dtype)
    gs = jnp.asarray(sizes, jnp.int32)

    # one cotangent for both sides: drawn in f32, rounded to the tested dtype
    cot = jax.random.normal(kc, (m, n), jnp.float32).astype(dtype)

    def run(lhs, rhs, **kw):
        f = lambda a, b: kernlib.grouped_matmul(a, b, gs, **kw)
        out, vjp = jax.vjp(f, lhs, rhs)
        return out, vjp(cot.astype(out.dtype))

    out, (dl, dr) = run(lhs, rhs, implementation=impl, interpret=True, config=config)
    ref, (rdl, rdr) = run(lhs.astype(jnp.float32), rhs.astype(jnp.float32), implementation="xla")
    assert out.dtype == lhs.dtype
    assert_close(out, ref, "fwd", dtype, f"{impl} out")
    assert_close(dl, rdl, "grad", dtype, f"{impl} dlhs")
    assert_close(dr, rdr, "grad", dtype, f"{impl} drhs")
    return out


@pytest.fixture
def gmm_compare():
    return compare


@pytest.fixture
def gmm_lowering_args():
    """Abstract bf16 lhs [4096, 1024], rhs of 8 groups [8, 1024, 512], and group sizes."""
    return (
        jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16),
        jax.ShapeDtypeStruct((8, 1024, 512), jnp.bfloat16),
        jax.ShapeDtypeStruct((8,), jnp.int32),
    )


# group sizes: empty groups, a group spanning tiles, all rows in one group, a short tail
SIZES = [[10, 0, 25, 5], [0, 0, 0, 0], [50, 0, 0, 0], [3, 7, 0, 30, 0, 1]]
