import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib
from jaxstack.kernlib.ops.quantized_matmul import base


@pytest.mark.parametrize("bits,tile,symmetric,err", [(8, None, True, 0.02), (4, 32, False, 0.3)])
def test_close_to_the_dense_matmul(quantized_weight, bits, tile, symmetric, err):
    qt, w = quantized_weight(64, 24, bits, tile, symmetric)
    x = jax.random.normal(jax.random.key(0), (5, 64))
    out = np.asarray(kernlib.quantized_matmul(x, qt))
    dense = np.asarray(x) @ w
    assert np.abs(out - dense).max() < err * np.abs(dense).max()
    # exactly the matmul with the dequantised weight
    deq = kernlib.dequantize(qt.values, qt.scales, qt.zero_points, jnp.float32)
    np.testing.assert_allclose(out, np.asarray(x @ deq), rtol=1e-5, atol=1e-5)


def test_int4_codes_stay_in_range(quantized_weight):
    qt, _ = quantized_weight(32, 8, 4, 16, False)
    codes = np.asarray(qt.values.astype(jnp.int8))
    assert qt.values.dtype == jnp.int4 and codes.min() >= -8 and codes.max() <= 7


def test_weights_get_no_gradient(quantized_weight):
    qt, _ = quantized_weight(16, 8, 8, None, True)
    x = jnp.ones((2, 16))
    g = jax.grad(lambda s: kernlib.quantized_matmul(x, qt._replace(scales=s)).sum())(qt.scales)
    assert np.all(np.asarray(g) == 0)


def test_non_quantized_weight_and_bad_scales_raise(quantized_weight):
    with pytest.raises(kernlib.ConfigError, match="quantised tensor"):
        kernlib.quantized_matmul(jnp.ones((2, 4)), jnp.ones((4, 4)))
    qt, _ = quantized_weight(16, 8, 8, None, True)
    with pytest.raises(kernlib.ConfigError, match="tile_k dividing K"):
        kernlib.quantized_matmul(jnp.ones((2, 16)), qt._replace(scales=jnp.ones((3, 8))))


@pytest.mark.parametrize(
    "lead,bits,tile,symmetric,dtype",
    [
        ((1,), 8, None, True, "float32"),
        ((2, 8), 8, 128, True, "float32"),
        ((16,), 4, 64, False, "float32"),
        ((1, 1), 8, None, True, "bfloat16"),
        ((17,), 8, 64, False, "float32"),  # above STREAMED_MAX_ROWS: the single dot
    ],
)
def test_decode_rows_match_the_reference(quantized_weight, lead, bits, tile, symmetric, dtype):
    qt, _ = quantized_weight(512, 96, bits, tile, symmetric, dtype)
    x = jax.random.normal(jax.random.key(1), (*lead, 512), dtype)
    cot = jax.random.normal(jax.random.key(2), (*lead, 96), dtype)

    def run(f):
        out, vjp = jax.vjp(f, x)
        return out, vjp(cot)[0]

    out, dx = run(lambda x: kernlib.quantized_matmul(x, qt, implementation="xla"))
    ref, rdx = run(lambda x: base.reference(x, qt.values, qt.scales, qt.zero_points))
    assert out.shape == (*lead, 96) and out.dtype == x.dtype
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), tol, tol)
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(rdx, np.float32), tol, tol)


@pytest.mark.parametrize("rows", [1, 16])
def test_decode_rows_never_hold_the_whole_float_weight(quantized_weight, rows):
    """The memory-bound case reads the int8 codes once: no [K, N] float buffer is compiled."""
    qt, _ = quantized_weight(1024, 256, 8, None, True)
    f = jax.jit(
        lambda x, v, s: kernlib.quantized_matmul(
            x, qt._replace(values=v, scales=s), implementation="xla"
        )
    )
    hlo = f.lower(jnp.ones((rows, 1024)), qt.values, qt.scales).compile().as_text()
    assert "s8[1024,256]" in hlo and "f32[1024,256]" not in hlo
