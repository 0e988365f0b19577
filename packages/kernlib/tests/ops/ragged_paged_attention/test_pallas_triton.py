import jax
import jax.numpy as jnp
import pytest

from jaxstack.kernlib._src.lowering import lower_for
from jaxstack.kernlib.ops.ragged_paged_attention import pallas_triton


def test_mixed_prefill_and_decode_with_holes_and_padding(rpa_compare, rpa_batch):
    batch = rpa_batch([20, 1, 5, 1, 0], [20, 37, 40, 1, 0], live=4)
    out = rpa_compare("pallas_triton", batch, sliding_window=9, logits_soft_cap=3.0)
    assert float(jnp.abs(out[27:]).max()) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "q_lens,kv_lens",
    [([1] * 6, [1, 16, 17, 33, 64, 5]), ([33, 1, 16], [70, 9, 16]), ([40], [40])],
)
def test_sweep(rpa_compare, rpa_batch, dtype, q_lens, kv_lens):
    batch = rpa_batch(q_lens, kv_lens, heads=6, kv_heads=2, dtype=dtype)
    for opts in (dict(), dict(sliding_window=5), dict(logits_soft_cap=2.0, scale=0.2)):
        for cfg in (None, {"block_q": 32}):
            rpa_compare("pallas_triton", batch, config=cfg, **opts)


def test_lowers_to_triton():
    args = [
        jax.ShapeDtypeStruct((64, 32, 128), jnp.bfloat16),
        jax.ShapeDtypeStruct((4097, 16, 8, 128), jnp.bfloat16),
        jax.ShapeDtypeStruct((4097, 16, 8, 128), jnp.bfloat16),
        jax.ShapeDtypeStruct((64,), jnp.int32),
        jax.ShapeDtypeStruct((64, 128), jnp.int32),
        jax.ShapeDtypeStruct((65,), jnp.int32),
    ]
    f = lambda *a: pallas_triton.run(*a, config=pallas_triton.Config())
    assert lower_for("gpu", f, *args).count("__gpu$xla.gpu.triton") == 1


def test_small_pages_are_unsupported():
    q = jnp.ones((2, 2, 16))
    assert "page_size 8" in pallas_triton.check(q, jnp.ones((4, 8, 2, 16)))
