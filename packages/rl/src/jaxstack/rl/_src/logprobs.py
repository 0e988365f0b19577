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
