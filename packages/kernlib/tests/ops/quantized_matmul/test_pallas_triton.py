import jax
import jax.numpy as jnp
import pytest
from kernlib_lowering import count_kernels

from jaxstack.kernlib.ops.quantized_matmul import pallas_triton


@pytest.mark.parametrize("bits,tile,symmetric", [(8, 32, True), (4, 64, False)])
def test_per_tile_scales_forward_and_gradient(qmm_compare, bits, tile, symmetric):
    qmm_compare("pallas_triton", (3, 5), 128, 40, bits, tile, symmetric)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("tile,symmetric", [(None, True), (None, False), (32, True), (128, False)])
def test_sweep(qmm_compare, dtype, bits, tile, symmetric):
    qmm_compare("pallas_triton", (1,), 256, 72, bits, tile, symmetric, dtype)
    qmm_compare("pallas_triton", (33,), 256, 16, bits, tile, symmetric, dtype)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int4])
def test_lowers_to_triton(dtype):
    x = jax.ShapeDtypeStruct((16, 4096), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((4096, 4096), dtype)
    s = jax.ShapeDtypeStruct((32, 4096), jnp.bfloat16)
    f = lambda x, v, s: pallas_triton.run(x, v, s, s, config=pallas_triton.Config())
    assert count_kernels("gpu", f, x, v, s) == 1


def test_scale_tiles_without_a_power_of_two_block_are_unsupported():
    assert "no power-of-two block" in pallas_triton.check(
        jnp.ones((2, 24)), jnp.ones((24, 8), jnp.int8), jnp.ones((3, 8))
    )
