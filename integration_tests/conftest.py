"""Integration tests run on the backend named by JAXSTACK_TEST_BACKEND (cpu by default)."""

import os

import pytest

BACKEND = os.environ.get("JAXSTACK_TEST_BACKEND", "cpu")


@pytest.fixture(scope="session")
def backend() -> str:
    import jax

    if not jax.devices(BACKEND):
        pytest.skip(f"no {BACKEND} device visible to JAX")
    return BACKEND
