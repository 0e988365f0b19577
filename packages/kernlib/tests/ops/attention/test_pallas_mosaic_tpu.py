"""The Mosaic TPU flash-attention kernels (interpret mode) against the XLA reference."""

import jax.numpy as jnp
import pytest
from kernlib_lowering import ARGS, count_kernels, with_backward

from jaxstack import kernlib
from jaxstack.kernlib.ops.attention import pallas_mosaic_tpu

IMPL = "pallas_mosaic_tpu"


def test_every_feature_at_once_forward_and_gradients(attention_case, attention_compare):
    case = attention_case(2, 20, 4, 1, 16, segments=[[(1, 7), (2, 10), (0, 3)], [(0, 20)]])
    out, _ = attention_compare(IMPL, case, sliding_window=6, logits_soft_cap=3.0)
    assert float(jnp.abs(out[1]).max()) == 0.0


@pytest.mark.slow
def test_multi_block_sequence_with_block_skipping(attention_case, attention_compare):
    # 300 tokens in 128-blocks: causal + window skip whole key blocks in all three kernels
    case = attention_case(1, 300, 2, 1, 16)
    attention_compare(IMPL, case, sliding_window=100)
    attention_compare(IMPL, case, causal=False, sliding_window=150)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shape_and_feature_sweep(attention_check_sweep, dtype):
    attention_check_sweep(IMPL, dtype)


def test_lowers_to_mosaic_with_bf16_and_gqa():
    cfg = pallas_mosaic_tpu.Config(block_q=256, block_k=256)

    def fwd_bwd(q, k, v, seg):
        f = lambda q, k, v: pallas_mosaic_tpu.run(q, k, v, seg, config=cfg, sliding_window=200)
        return with_backward(f)(q, k, v)

    assert count_kernels("tpu", fwd_bwd, *ARGS["attention"]) == 3


def test_config_validation():
    with pytest.raises(kernlib.ConfigError, match="multiple of 128"):
        pallas_mosaic_tpu.Config(block_k=64)
