import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib


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
