"""Log-probabilities of given tokens under a model, the quantity every objective here uses."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax


def token_logprobs(
    apply: Any, params: Any, batch: dict[str, jax.Array], temperature: float = 1.0
) -> jax.Array:
    """log pi(targets[b, t] | tokens[b, :t+1]) as float32 [B, T] (garbage where masked out).

    `temperature` scales the logits as a sampler does, so that the log-probs of sampled tokens
    are those of the distribution they were drawn from (RL with rollout.temperature != 1).
    """
    logits, _ = apply(params, batch["tokens"], batch["positions"], batch["segment_ids"])
    return -optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32) / temperature, batch["targets"]
    )


def sequence_logprobs(token_logps: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-row sums of the masked token log-probs: log pi(completion | prompt), [B]."""
    return (token_logps * mask).sum(axis=-1)


MIN_COMPLETION_TOKENS = 64
"""The fewest positions `completion_positions` lists; the count doubles from it, so the update
compiles for a handful of counts."""


def completion_positions(loss_mask: np.ndarray) -> np.ndarray:
    """`completion_index`: the flat positions (row * T + column) of a [B, T] batch's loss-mask
    tokens, padded with B * T (no position) to the smallest of 64, 128, 256, ... entries that
    holds them, at most B * T."""
    flat = np.flatnonzero(loss_mask.reshape(-1) > 0)
    count = MIN_COMPLETION_TOKENS
    while count < flat.size:
        count *= 2
    count = min(count, loss_mask.size)
    index = np.full(count, loss_mask.size, np.int32)
    index[: flat.size] = flat
    return index


def completion_logprobs(
    apply: Any, params: Any, batch: dict[str, jax.Array], temperature: float = 1.0
) -> jax.Array:
    """`token_logprobs` computed at the batch's `completion_index` positions only: float32
    [B, T], equal to `token_logprobs` there and 0 at every other position.

    The model runs over whole rows (a completion attends to its prompt), but the output
    projection and softmax, the [B, T, vocab] part of the forward and backward passes, run on
    the listed positions alone (`completion_positions`: the loss mask's tokens). A tiny GRPO
    train step (128 rows of 16 columns, completions of <= 4 tokens) ran 1.07-1.58x faster with
    a 259-token vocabulary, 2.6-3.2x with 32,000 (benchmarks/rl/grpo_logprobs_ab.py). `apply`
    is nnlib's `as_function` apply (its `hidden_states` and `unembed` methods).

    A batch with packed rows (`pack_rows`: `packed_tokens`, `packed_positions`,
    `packed_segment_ids`, and `completion_source`, where each `completion_index` position sits
    in them) runs the model over the packed rows instead, several completions to a row, and
    returns the same log-probs in the batch's `[B, T]` layout.
    """
    prefix = "packed_" if "packed_tokens" in batch else ""
    x, _, _ = apply.method("hidden_states")(
        params, *(batch[prefix + key] for key in ("tokens", "positions", "segment_ids"))
    )
    return logprobs_at_completions(apply, params, x, batch, temperature)


def logprobs_at_completions(
    apply: Any, params: Any, x: jax.Array, batch: dict[str, jax.Array], temperature: float
) -> jax.Array:
    """`completion_logprobs` from the final hidden states `x`: [B, T, d_model] (PPO's value
    head reads them too), or of the packed rows, read at the batch's `completion_source`."""
    rows, columns = batch["targets"].shape
    index = batch["completion_index"]
    picked = jnp.minimum(index, rows * columns - 1)  # padding entries read the last position
    x = x.reshape(-1, x.shape[-1])[batch.get("completion_source", picked)]
    logits = apply.method("unembed")(params, x)
    targets = batch["targets"].reshape(-1)[picked]
    logps = -optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32) / temperature, targets
    )
    out = jnp.zeros(rows * columns, jnp.float32).at[index].set(logps, mode="drop")
    return out.reshape(rows, columns)
