"""The Triton flash-attention kernels (interpret mode) against the XLA reference."""

import jax.numpy as jnp
import pytest
from kernlib_lowering import ARGS, count_kernels, with_backward

from jaxstack import kernlib
from jaxstack.kernlib.ops.attention import pallas_triton

IMPL = "pallas_triton"
SMALL = dict(block_q=16, block_k=16, block_q_bwd=16, block_k_bwd=16)


def test_every_feature_at_once_forward_and_gradients(attention_case, attention_compare):
    # odd length (24 -> padded to 32), GQA 2:1, packed documents, padding, an empty row,
    # sliding window and soft-cap together
    case = attention_case(2, 24, 4, 2, 16, segments=[[(1, 9), (2, 11), (0, 4)], [(0, 24)]])
    out, _ = attention_compare(IMPL, case, config=SMALL, sliding_window=5, logits_soft_cap=4.0)
    assert float(jnp.abs(out[1]).max()) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shape_and_feature_sweep(attention_check_sweep, dtype):
    attention_check_sweep(IMPL, dtype, config=SMALL)


def test_lowers_to_triton_for_an_h100_with_bf16_and_gqa():
    def fwd_bwd(q, k, v, seg):
        f = lambda q, k, v: pallas_triton.run(
            q, k, v, seg, config=pallas_triton.Config(), sliding_window=256, logits_soft_cap=30.0
        )
        return with_backward(f)(q, k, v)

    # forward, dq, dk+dv
    assert count_kernels("gpu", fwd_bwd, *ARGS["attention"]) == 3


def test_config_validation():
    with pytest.raises(kernlib.ConfigError, match="power of two"):
        pallas_triton.Config(block_q=48)
    with pytest.raises(kernlib.ConfigError, match="no field"):
        pallas_triton.Config.from_dict({"block_x": 16})
