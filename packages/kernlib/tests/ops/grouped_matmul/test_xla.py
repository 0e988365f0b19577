import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib


def test_reference_is_per_group_matmul_with_zero_tail():
    rng = np.random.default_rng(0)
    lhs = rng.normal(size=(9, 4)).astype(np.float32)
    rhs = rng.normal(size=(3, 4, 5)).astype(np.float32)
    sizes = np.array([2, 0, 5])
    out = np.asarray(kernlib.grouped_matmul(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes)))
    np.testing.assert_allclose(out[:2], lhs[:2] @ rhs[0], rtol=1e-5)
    np.testing.assert_allclose(out[2:7], lhs[2:7] @ rhs[2], rtol=1e-5)
    assert np.all(out[7:] == 0)


def test_mismatched_shapes_raise():
    with pytest.raises(kernlib.ConfigError, match="rhs"):
        kernlib.grouped_matmul(jnp.ones((4, 3)), jnp.ones((2, 5, 6)), jnp.array([2, 2]))
