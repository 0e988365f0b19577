import jax
import jax.numpy as jnp
import pytest
from kernlib_lowering import count_kernels

from jaxstack.kernlib.ops.quantized_matmul import pallas_mosaic_tpu


@pytest.mark.parametrize("bits,tile,symmetric", [(8, None, True), (4, 128, False)])
def test_forward_and_gradient(qmm_compare, bits, tile, symmetric):
    qmm_compare("pallas_mosaic_tpu", (3, 5), 256, 40, bits, tile, symmetric)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("tile,symmetric", [(None, True), (None, False), (128, True)])
def test_sweep(qmm_compare, dtype, bits, tile, symmetric):
    qmm_compare("pallas_mosaic_tpu", (1,), 512, 200, bits, tile, symmetric, dtype)
    qmm_compare("pallas_mosaic_tpu", (20,), 256, 16, bits, tile, symmetric, dtype)


def test_lowers_to_mosaic():
    x = jax.ShapeDtypeStruct((16, 4096), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((4096, 4096), jnp.int8)
    s = jax.ShapeDtypeStruct((8, 4096), jnp.bfloat16)
    f = lambda x, v, s: pallas_mosaic_tpu.run(x, v, s, s, config=pallas_mosaic_tpu.Config())
    assert count_kernels("tpu", f, x, v, s) == 1
