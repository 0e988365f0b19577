"""Per-format round trips: stored dtypes and sizes, and error bounds each format guarantees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import quantlib as ql

K, N = 256, 64


@pytest.fixture(scope="module")
def w():
    return jax.random.normal(jax.random.key(0), (K, N), jnp.float32)


@pytest.mark.parametrize(
    "qtype, dtype, nbytes",
    [
        ("int8", jnp.int8, K * N),
        ("int4", jnp.uint8, K * N // 2),
        ("nf4", jnp.uint8, K * N // 2),
        ("fp8_e4m3", jnp.float8_e4m3fn, K * N),
        ("fp8_e5m2", jnp.float8_e5m2, K * N),
    ],
)
def test_values_are_stored_in_the_format_packed_where_four_bit(w, qtype, dtype, nbytes):
    qt = ql.quantize_tensor(w, qtype)
    assert qt.values.dtype == dtype
    assert qt.values.nbytes == nbytes
    assert qt.shape == (K, N) and qt.dtype == jnp.float32
    assert qt.dequantize().shape == w.shape


@pytest.mark.parametrize("qtype, steps", [("int8", 255), ("int4", 15)])
def test_integer_round_trip_error_is_at_most_half_a_step(w, qtype, steps):
    """Symmetric integers spread [-absmax, absmax] over `steps` steps (15 for int4): the
    bound sits at the outer edge of the top code's bucket, half a step beyond it."""
    qt = ql.quantize_tensor(w, qtype)
    step = 2 * jnp.abs(w).max(axis=0) / steps  # per output channel
    err = jnp.abs(qt.dequantize() - w)
    assert bool(jnp.all(err <= step / 2 * (1 + 1e-4)))  # 1e-4: float32 rounding of the scale
    assert float(err.max()) > float(step.min()) / 8  # really quantised, not passed through


@pytest.mark.parametrize("qtype, mantissa_bits", [("fp8_e4m3", 3), ("fp8_e5m2", 2)])
def test_fp8_round_trip_relative_error_is_half_an_ulp(w, qtype, mantissa_bits):
    qt = ql.quantize_tensor(w, qtype)
    big = jnp.abs(w) > jnp.abs(w).max() / 64  # away from the subnormal range
    rel = jnp.abs(qt.dequantize() - w) / jnp.abs(w)
    assert float(jnp.where(big, rel, 0).max()) <= 2.0 ** -(mantissa_bits + 1) * (1 + 1e-5)


def test_nf4_error_is_at_most_half_the_widest_level_gap(w):
    qt = ql.quantize_tensor(w, "nf4", tile_size=64)
    absmax = jnp.abs(w.reshape(K // 64, 64, N)).max(axis=1)
    widest_gap = 1.0 - 0.6961928009986877  # between the two lowest NF4 levels
    bound = jnp.repeat(absmax, 64, axis=0) * widest_gap / 2
    assert bool(jnp.all(jnp.abs(qt.dequantize() - w) <= bound * (1 + 1e-5)))


def test_int4_packing_keeps_every_code():
    codes = jnp.tile(jnp.arange(-7, 8, dtype=jnp.float32), 4).reshape(60, 1)
    qt = ql.quantize_tensor(codes, "int4")  # absmax 7 -> scale 7 / 7.5: each value its own code
    np.testing.assert_array_equal(np.asarray(qt.codes())[:, 0], np.asarray(codes[:, 0]))
    assert qt.values.shape == (30, 1)


def test_tiles_confine_an_outlier_to_its_own_tile(w):
    spiked = w.at[0, :].mul(100.0)  # one huge row in the first tile
    per_channel = ql.quantize_tensor(spiked, "int8")
    tiled = ql.quantize_tensor(spiked, "int8", tile_size=64)
    rest = slice(64, None)  # rows outside the spiked tile
    err_channel = jnp.abs(per_channel.dequantize() - spiked)[rest].mean()
    err_tiled = jnp.abs(tiled.dequantize() - spiked)[rest].mean()
    assert float(err_tiled) < float(err_channel) / 20
    assert tiled.scales.shape == (K // 64, N) and tiled.tile_size == 64


@pytest.mark.parametrize("method", ["percentile,99", "rms,3"])
def test_clipping_calibration_trades_outliers_for_finer_steps(w, method):
    spiked = w.at[0, :].mul(50.0)
    absmax = ql.quantize_tensor(spiked, "int4")
    clipped = ql.quantize_tensor(spiked, "int4", calibration_method=method)
    bulk = slice(1, None)
    err = lambda qt: float(jnp.abs(qt.dequantize() - spiked)[bulk].mean())
    assert err(clipped) < err(absmax) / 2


def test_tile_that_does_not_divide_is_an_error(w):
    with pytest.raises(ql.RuleError, match="tile_size=100 does not divide the contracted size 256"):
        ql.quantize_tensor(w, "int8", tile_size=100)


def test_contracted_axes_of_a_multi_axis_kernel_share_the_scales():
    k = jax.random.normal(jax.random.key(2), (4, 16, 32))  # [heads, head_dim, d_model]
    qt = ql.quantize_tensor(k, "int8", contract_ndim=2)
    assert qt.matrix_shape == (64, 32) and qt.scales.shape == (1, 32)
    step = jnp.abs(k.reshape(64, 32)).max(axis=0) / 127.5
    assert bool(jnp.all(jnp.abs(qt.dequantize() - k).reshape(64, 32) <= step / 2 * (1 + 1e-4)))


def test_fake_quantize_is_the_dequantised_value_with_identity_gradient(w):
    fq = ql.fake_quantize(w, "int4", tile_size=128)
    np.testing.assert_array_equal(fq, ql.quantize_tensor(w, "int4", tile_size=128).dequantize())
    grad = jax.grad(lambda x: (ql.fake_quantize(x, "int4") * 3.0).sum())(w)
    np.testing.assert_array_equal(grad, jnp.full_like(w, 3.0))


def test_dynamic_activation_quantisation_is_per_token():
    x = jnp.stack([jnp.linspace(-1, 1, 128), jnp.linspace(-100, 100, 128)])
    xq = ql.fake_quantize_activation(x, "int8", "absmax")
    err = jnp.abs(xq - x).max(axis=-1)
    assert float(err[0]) <= 1 / 127.5 / 2 * 1.0001  # the small token keeps its own fine scale
    assert float(err[1]) <= 100 / 127.5 / 2 * 1.0001
