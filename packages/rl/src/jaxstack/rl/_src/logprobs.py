"""Log-probabilities of given tokens under a model, the quantity every objective here uses."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
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


def completion_window(loss_mask: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """The `width` columns of each row that start at its first loss-mask column, and the mask
    there ([B, width] column indices, [B, width] mask).

    In a row of prompt then completion (`sequence_batch`), the positions that predict the
    completion's tokens are contiguous: with `width` at least the longest completion, the
    window holds every one of them. Columns past the row's end are clamped to its last column
    and masked out; a `width` wider than the batch is cut to its columns."""
    columns = loss_mask.shape[1]
    width = min(width, columns)
    start = jnp.argmax(loss_mask > 0, axis=1)
    index = start[:, None] + jnp.arange(width)[None, :]
    inside = index < columns
    index = jnp.minimum(index, columns - 1)
    mask = jnp.take_along_axis(loss_mask, index, axis=1) * inside
    return index, mask


def completion_logprobs(
    apply: Any, params: Any, batch: dict[str, jax.Array], width: int, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """`token_logprobs` at the completion positions only: (log-probs, mask), float32 [B, width].

    The model runs over whole rows (the completion attends to its prompt), but the output
    projection and softmax, the [B, T, vocab] part of the forward and backward passes, run on
    the `completion_window` alone. `apply` is nnlib's `as_function` apply (its
    `hidden_states` and `unembed` methods). The log-probs equal `token_logprobs`' at the same
    positions.
    """
    x, _, _ = apply.method("hidden_states")(
        params, batch["tokens"], batch["positions"], batch["segment_ids"]
    )
    index, mask = completion_window(batch["loss_mask"], width)
    x = jnp.take_along_axis(x, index[..., None], axis=1)
    logits = apply.method("unembed")(params, x)
    targets = jnp.take_along_axis(batch["targets"], index, axis=1)
    logps = -optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32) / temperature, targets
    )
    return logps, mask
