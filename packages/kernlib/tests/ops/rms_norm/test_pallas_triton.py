import pytest
from kernlib_lowering import ARGS, count_kernels, with_backward

from jaxstack.kernlib.ops.rms_norm import pallas_triton


def test_odd_rows_and_width_forward_and_gradients(rms_compare):
    rms_compare("pallas_triton", (3, 5, 40), weight_offset=1.0)  # 15 rows, D padded to 64


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(1, 16), (7, 33), (2, 9, 128), (64, 256)])
@pytest.mark.parametrize("block_rows", [1, 4, 16])
def test_sweep(rms_compare, dtype, shape, block_rows):
    rms_compare("pallas_triton", shape, dtype, config={"block_rows": block_rows})


def test_lowers_to_triton():
    f = lambda x, w: pallas_triton.run(x, w, config=pallas_triton.Config())
    assert count_kernels("gpu", with_backward(f), *ARGS["rms_norm"]) == 2
