import jax.numpy as jnp
import pytest
from kernlib_lowering import ARGS, count_kernels, with_backward

from jaxstack import kernlib
from jaxstack.kernlib.ops.grouped_matmul import pallas_mosaic_tpu


def test_groups_sharing_tiles_and_empty_groups(gmm_compare):
    # 300 rows in 128-row tiles: groups straddle tile boundaries, two groups are empty
    out = gmm_compare("pallas_mosaic_tpu", 300, 24, 20, [100, 0, 120, 30, 0])
    assert float(jnp.abs(out[250:]).max()) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sweep(gmm_compare, dtype):
    for sizes in ([10, 0, 25, 5], [0, 0, 0, 0], [50, 0, 0, 0], [3, 7, 0, 30, 0, 1]):
        gmm_compare("pallas_mosaic_tpu", 50, 24, 20, sizes, dtype)
    gmm_compare("pallas_mosaic_tpu", 260, 200, 140, [129, 1, 0, 127], dtype)


def test_lowers_to_mosaic():
    def f(lhs, rhs, gs):
        g = lambda a, b: pallas_mosaic_tpu.run(a, b, gs, config=pallas_mosaic_tpu.Config())
        return with_backward(g)(lhs, rhs)

    assert count_kernels("tpu", f, *ARGS["grouped_matmul"]) == 3


def test_mixed_dtypes_are_unsupported_and_say_why():
    with pytest.raises(kernlib.UnsupportedError, match="mixed dtypes"):
        kernlib.grouped_matmul(
            jnp.ones((8, 4), jnp.bfloat16),
            jnp.ones((1, 4, 4)),
            jnp.array([8]),
            implementation="pallas_mosaic_tpu",
            interpret=True,
        )
