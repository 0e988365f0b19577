"""Per-row sampling on device: penalties, temperature, min-p, top-k, top-p, then a draw.

Every row carries its own settings as arrays, so one compiled function serves any mix of
greedy and sampled requests. Each row's random key is folded from the sequence's seed and
its output length, so a sequence samples the same tokens whatever shares its batch and
after a preemption. Log-probabilities are those of the raw model distribution (before any
processing), as vLLM and the OpenAI API report them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class SamplingInputs(NamedTuple):
    """Per-row settings, [S] each (padding rows: temperature 0)."""

    temperature: jax.Array
    top_k: jax.Array  # 0: no limit
    top_p: jax.Array
    min_p: jax.Array
    seed: jax.Array  # uint32
    step: jax.Array  # int32, tokens generated so far
    presence_penalty: jax.Array
    frequency_penalty: jax.Array
    repetition_penalty: jax.Array


class Penalties(NamedTuple):
    """Per-token inputs, built on the host only for steps where some row needs them."""

    output_counts: jax.Array  # [S, V] int32, occurrences of each token in the output
    prompt_mask: jax.Array  # [S, V] bool, tokens present in the prompt
    bias: jax.Array  # [S, V] float32 added to the logits: logit_bias, -inf for banned tokens


class Sampled(NamedTuple):
    token_ids: jax.Array  # [S] int32
    logprobs: jax.Array  # [S] raw log-probability of each sampled token
    top_ids: jax.Array  # [S, K]
    top_logprobs: jax.Array  # [S, K]


def apply_penalties(logits: jax.Array, s: SamplingInputs, p: Penalties) -> jax.Array:
    """OpenAI presence/frequency penalties on output tokens; CTRL repetition penalty on
    prompt and output tokens (divide positive logits, multiply negative ones); then the bias
    (logit_bias, and -inf on tokens a row may not sample yet)."""
    counts = p.output_counts.astype(logits.dtype)
    seen = (p.output_counts > 0) | p.prompt_mask
    rep = s.repetition_penalty[:, None]
    logits = jnp.where(seen, jnp.where(logits > 0, logits / rep, logits * rep), logits)
    logits = logits - s.frequency_penalty[:, None] * counts
    return logits - s.presence_penalty[:, None] * (counts > 0) + p.bias


def filter_logits(logits: jax.Array, s: SamplingInputs, *, top_k_top_p: bool = True) -> jax.Array:
    """Temperature-scaled logits with min-p, top-k and top-p cut to -inf.

    `top_k_top_p` (static) False leaves out the full-vocabulary sort that top-k and top-p need,
    for batches where no row asks for either (the sort was a fifth of a 32-row sampled step).
    """
    t = jnp.where(s.temperature > 0, s.temperature, 1.0)[:, None]
    logits = logits / t
    probs = jax.nn.softmax(logits, axis=-1)
    logits = jnp.where(probs < s.min_p[:, None] * probs.max(-1, keepdims=True), -jnp.inf, logits)
    if not top_k_top_p:
        return logits
    vocab = logits.shape[-1]
    ordered = -jnp.sort(-logits, axis=-1)  # descending
    k = jnp.where(s.top_k > 0, jnp.minimum(s.top_k, vocab), vocab)
    kth = jnp.take_along_axis(ordered, (k - 1)[:, None], axis=-1)
    sorted_probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass of strictly better tokens
    keep = before < s.top_p[:, None]
    nucleus_min = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < jnp.maximum(kth, nucleus_min), -jnp.inf, logits)


def first_argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, -1)` (the first maximum) as two plain reductions: XLA:CPU runs argmax's
    paired (value, index) reduction unvectorised, 6x slower on a [32, 8000] row block."""
    best = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x == best, index, x.shape[-1]), axis=-1)


def draw(logits: jax.Array, keys: jax.Array) -> jax.Array:
    """One token per row from softmax(logits), by inverting the row's cumulative distribution.

    Two uniforms per row pick a block of the vocabulary by the blocks' masses, then a token
    inside that block by its own cumulative masses, so each step sums the vocabulary once and
    cumsums two short rows, and draws 2 random numbers a row, not a vocabulary's worth (the
    Gumbel trick of `jax.random.categorical` spent a third of a 32-row sampled step on
    random bits and its argmax). Tokens whose logit is -inf have mass 0 and are never drawn.
    """
    rows, vocab = logits.shape
    block = 1 << ((vocab.bit_length() + 1) // 2)  # about sqrt(vocab): both cumsums are short
    num_blocks = -(-vocab // block)
    probs = jax.nn.softmax(logits, axis=-1)
    blocks = jnp.pad(probs, ((0, 0), (0, num_blocks * block - vocab))).reshape(rows, -1, block)
    u = jax.vmap(lambda key: jax.random.uniform(key, (2,)))(keys)
    b = _inverse_cdf(blocks.sum(-1), u[:, 0])
    inside = jnp.take_along_axis(blocks, b[:, None, None], axis=1)[:, 0]
    return b * block + _inverse_cdf(inside, u[:, 1])


def _inverse_cdf(mass: jax.Array, u: jax.Array) -> jax.Array:
    """Per row, the first index whose cumulative mass exceeds `u` times the row's total; never
    past the last index with mass (where rounding puts `u * total` at the total)."""
    cum = jnp.cumsum(mass, axis=-1)
    total = cum[:, -1:]
    past = jnp.sum(cum <= u[:, None] * total, axis=-1)
    return jnp.minimum(past, jnp.sum(cum < total, axis=-1)).astype(jnp.int32)


def sample(
    logits: jax.Array,
    s: SamplingInputs,
    penalties: Penalties | None,
    *,
    num_top: int,
    all_greedy: bool,
    top_k_top_p: bool = True,
) -> Sampled:
    """Next tokens from last-position logits [S, V] and `num_top` alternatives per row (0:
    none are computed, the sampled token is the one alternative given).

    `all_greedy` (static) skips the filters and the draw when no row samples; `top_k_top_p`
    (static) False skips the sort when rows sample but none limits top-k or top-p.
    """
    raw = jax.nn.log_softmax(logits, axis=-1)
    if penalties is not None:
        logits = apply_penalties(logits, s, penalties)
    token_ids = first_argmax(logits)
    if not all_greedy:
        keys = jax.vmap(lambda seed, step: jax.random.fold_in(jax.random.key(seed), step))(
            s.seed, s.step
        )
        drawn = draw(filter_logits(logits, s, top_k_top_p=top_k_top_p), keys)
        token_ids = jnp.where(s.temperature > 0, drawn, token_ids)
    chosen = jnp.take_along_axis(raw, token_ids[:, None], axis=-1)[:, 0]
    if not num_top:  # no row asks for alternatives: the sampled token stands in for them
        return Sampled(token_ids, chosen, token_ids[:, None], chosen[:, None])
    top_logprobs, top_ids = jax.lax.top_k(raw, num_top)
    return Sampled(token_ids, chosen, top_ids.astype(jnp.int32), top_logprobs)
