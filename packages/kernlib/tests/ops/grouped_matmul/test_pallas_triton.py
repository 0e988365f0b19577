import jax.numpy as jnp
import pytest
from kernlib_lowering import ARGS, count_kernels, with_backward

from jaxstack.kernlib.ops.grouped_matmul import pallas_triton

SMALL = dict(block_m=16, block_k=16, block_n=16)


def test_groups_sharing_tiles_and_empty_groups(gmm_compare):
    out = gmm_compare("pallas_triton", 50, 24, 20, [3, 7, 0, 30, 0, 1], config=SMALL)
    assert float(jnp.abs(out[41:]).max()) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sweep(gmm_compare, dtype):
    for sizes in ([10, 0, 25, 5], [0, 0, 0, 0], [50, 0, 0, 0], [1] * 50):
        for cfg in (SMALL, None):
            gmm_compare("pallas_triton", 50, 40, 36, sizes[: len(sizes)], dtype, config=cfg)


def test_lowers_to_triton():
    def f(lhs, rhs, gs):
        g = lambda a, b: pallas_triton.run(a, b, gs, config=pallas_triton.Config())
        return with_backward(g)(lhs, rhs)

    assert count_kernels("gpu", f, *ARGS["grouped_matmul"]) == 3
