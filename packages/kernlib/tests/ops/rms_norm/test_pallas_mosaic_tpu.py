import pytest
from kernlib_lowering import ARGS, count_kernels, with_backward

from jaxstack import kernlib
from jaxstack.kernlib.ops.rms_norm import pallas_mosaic_tpu


def test_odd_rows_and_width_forward_and_gradients(rms_compare):
    rms_compare("pallas_mosaic_tpu", (3, 5, 40), config={"block_rows": 8})


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 16), (7, 33), (2, 9, 128), (300, 256)])
def test_sweep(rms_compare, dtype, shape):
    rms_compare("pallas_mosaic_tpu", shape, dtype)


def test_lowers_to_mosaic():
    f = lambda x, w: pallas_mosaic_tpu.run(x, w, config=pallas_mosaic_tpu.Config())
    assert count_kernels("tpu", with_backward(f), *ARGS["rms_norm"]) == 2


def test_config_validation():
    with pytest.raises(kernlib.ConfigError, match="multiple of 8"):
        pallas_mosaic_tpu.Config(block_rows=12)
