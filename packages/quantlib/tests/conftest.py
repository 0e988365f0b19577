import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxstack import nnlib

SEQ = 32


@pytest.fixture(scope="session")
def small_config():
    """A two-layer Llama small enough for quick tests; init_std 0.1 gives peaked logits."""
    return nnlib.get_preset("tiny").replace(
        d_model=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=256,
        vocab_size=64,
        max_seq_len=SEQ,
        init_std=0.1,
    )


@pytest.fixture
def model(small_config):
    return nnlib.Transformer(small_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def batch():
    tokens = jax.random.randint(jax.random.key(1), (2, SEQ), 0, 64)
    positions = jnp.broadcast_to(jnp.arange(SEQ, dtype=jnp.int32), (2, SEQ))
    targets = jnp.roll(tokens, -1, axis=1)
    return {
        "tokens": tokens,
        "positions": positions,
        "segment_ids": jnp.ones_like(tokens),
        "targets": targets,
        "loss_mask": jnp.ones(tokens.shape, jnp.float32),
    }
