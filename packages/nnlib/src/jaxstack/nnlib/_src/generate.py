"""generate: prefill + token-by-token decode with a contiguous KV cache (tests, demos).

The whole decode loop is one jitted `lax.scan`; sampling is greedy (temperature 0),
temperature, and optionally top-k. Serving has its own engine; this is the simple path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstack.nnlib._src.cache import ContiguousKVCache
from jaxstack.nnlib._src.errors import Error


def sample_logits(
    logits: jax.Array, rng: jax.Array, *, temperature: float, top_k: int | None
) -> jax.Array:
    """Next token ids [B] from last-position logits [B, V]."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def generate(
    model: nnx.Module,
    prompt_tokens: jax.Array,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    rng: jax.Array | None = None,
    eos_id: int | None = None,
) -> jax.Array:
    """Continue `prompt_tokens` [B, P] by `max_new_tokens` tokens.

    Returns int32 [B, P + max_new_tokens]: the prompt followed by the new tokens; once a row
    emits `eos_id`, the rest of that row is `eos_id`.
    """
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    if prompt_tokens.ndim != 2:
        raise Error(f"prompt_tokens must be [batch, prompt_len], got shape {prompt_tokens.shape}")
    if temperature < 0:
        raise Error(f"temperature={temperature} must be >= 0")
    if temperature > 0 and rng is None:
        raise Error("sampling with temperature > 0 needs rng=jax.random.key(...)")
    rng = jax.random.key(0) if rng is None else rng
    if max_new_tokens <= 0:
        return prompt_tokens
    b, p = prompt_tokens.shape
    cache = ContiguousKVCache.create(model.config, b, p + max_new_tokens)
    graphdef, state = nnx.split(model)
    return _run(
        graphdef,
        state,
        prompt_tokens,
        cache,
        rng,
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_k=top_k,
        eos_id=eos_id,
    )


@functools.partial(
    jax.jit, static_argnums=0, static_argnames=("max_new_tokens", "temperature", "top_k", "eos_id")
)
def _run(graphdef, state, prompt, cache, rng, *, max_new_tokens, temperature, top_k, eos_id):
    """Prefill + decode loop; compiled once per model structure and sampling settings."""

    def apply(tokens, positions, cache):
        return nnx.merge(graphdef, state, copy=True)(tokens, positions, None, cache)

    b, p = prompt.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    logits, cache = apply(prompt, positions, cache)
    rng, sub = jax.random.split(rng)
    first = sample_logits(logits[:, -1], sub, temperature=temperature, top_k=top_k)
    done = jnp.zeros((b,), bool) if eos_id is None else first == eos_id

    def step(carry, i):
        token, cache, rng, done = carry
        pos = jnp.full((b, 1), p + i, jnp.int32)
        logits, cache = apply(token[:, None], pos, cache)
        rng, sub = jax.random.split(rng)
        nxt = sample_logits(logits[:, -1], sub, temperature=temperature, top_k=top_k)
        if eos_id is not None:
            nxt = jnp.where(done, eos_id, nxt)
            done = done | (nxt == eos_id)
        return (nxt, cache, rng, done), nxt

    _, rest = jax.lax.scan(step, (first, cache, rng, done), jnp.arange(max_new_tokens - 1))
    new = jnp.concatenate([first[:, None], rest.T], axis=1)
    return jnp.concatenate([prompt, new], axis=1)
