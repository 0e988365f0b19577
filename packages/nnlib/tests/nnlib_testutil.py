"""Shared helpers of the nnlib tests (imported by name: tests/ is put on sys.path by conftest)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack import nnlib

SMALL = nnlib.ModelConfig(
    vocab_size=97,
    d_model=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_seq_len=64,
)


def make(config=SMALL, seed=0, **kw):
    return nnlib.Transformer(config.replace(**kw) if kw else config, rngs=nnx.Rngs(seed))


def batch(b=2, t=12, vocab=97, seed=1):
    tokens = jax.random.randint(jax.random.key(seed), (b, t), 0, vocab, dtype=jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return tokens, positions


def stacked_copy(unrolled: nnx.Module) -> nnx.Module:
    """A scan_layers=True model holding exactly the params of an unrolled one."""
    c = unrolled.config
    scanned = nnlib.Transformer(c.replace(scan_layers=True), rngs=nnx.Rngs(123))
    flat = dict(nnx.to_flat_state(nnx.state(unrolled, nnx.Param)))
    state = nnx.state(scanned, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        if path[0] == "layers":
            var[...] = jnp.stack([flat[("layers", i, *path[1:])][...] for i in range(c.num_layers)])
        else:
            var[...] = flat[path][...]
    nnx.update(scanned, state)
    return scanned


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


@functools.partial(jax.jit, static_argnums=0, static_argnames=("return_aux",))
def _forward(graphdef, state, tokens, positions, segment_ids, cache, return_aux=False):
    return nnx.merge(graphdef, state)(tokens, positions, segment_ids, cache, return_aux=return_aux)


def forward(model, tokens, positions, segment_ids=None, cache=None, *, return_aux=False):
    """model(...) under jit, compiled once per model structure (tests share the cache)."""
    graphdef, state = nnx.split(model)
    return _forward(graphdef, state, tokens, positions, segment_ids, cache, return_aux=return_aux)
