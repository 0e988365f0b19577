import jax.numpy as jnp
import pytest
from kernlib_lowering import ARGS, count_kernels

from jaxstack.kernlib.ops.ragged_paged_attention import pallas_triton

IMPL = "pallas_triton"


def test_mixed_prefill_and_decode_with_holes_and_padding(rpa_checks):
    rpa_checks.mixed_batch(IMPL)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sweep(rpa_checks, dtype, rpa_sweep_lens):
    rpa_checks.sweep(IMPL, dtype, rpa_sweep_lens, page_size=16, block_q=32)


def test_lowers_to_triton():
    f = lambda *a: pallas_triton.run(*a, config=pallas_triton.Config())
    assert count_kernels("gpu", f, *ARGS["ragged_paged_attention"]) == 1


def test_small_pages_are_unsupported():
    q = jnp.ones((2, 2, 16))
    assert "page_size 8" in pallas_triton.check(q, jnp.ones((4, 8, 2, 16)))
