import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib


def test_reference_formula_and_gemma_offset():
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    w = np.linspace(-1, 1, 8).astype(np.float32)
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5) * (1 + w)
    got = kernlib.rms_norm(jnp.asarray(x), jnp.asarray(w), eps=1e-5, weight_offset=1.0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    no_w = kernlib.rms_norm(jnp.asarray(x))
    np.testing.assert_allclose(
        np.asarray(no_w), x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6), rtol=1e-5
    )


def test_bf16_input_keeps_dtype_with_f32_statistics():
    x = jnp.full((2, 4), 300.0, jnp.bfloat16)  # x^2 would overflow nothing in f32
    y = kernlib.rms_norm(x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), 1.0, atol=1e-2)


def test_bad_weight_shape_raises():
    with pytest.raises(kernlib.ConfigError, match=r"weight must have shape \(4,\)"):
        kernlib.rms_norm(jnp.ones((2, 4)), jnp.ones((5,)))
