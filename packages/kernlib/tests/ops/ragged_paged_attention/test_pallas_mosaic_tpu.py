import pytest
from kernlib_lowering import ARGS, count_kernels

from jaxstack.kernlib.ops.ragged_paged_attention import pallas_mosaic_tpu

IMPL = "pallas_mosaic_tpu"


def test_mixed_prefill_and_decode_with_holes_and_padding(rpa_checks):
    rpa_checks.mixed_batch(IMPL)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sweep(rpa_checks, dtype, rpa_sweep_lens):
    rpa_checks.sweep(IMPL, dtype, rpa_sweep_lens, page_size=8, block_q=16)


def test_lowers_to_mosaic():
    f = lambda *a: pallas_mosaic_tpu.run(*a, config=pallas_mosaic_tpu.Config())
    assert count_kernels("tpu", f, *ARGS["ragged_paged_attention"]) == 1
