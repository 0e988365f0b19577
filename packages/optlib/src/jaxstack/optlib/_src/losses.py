"""Token-level cross-entropy for language models: masked, token-weighted, with z-loss.

The loss is the mean over *tokens* that `loss_mask` keeps, across the whole batch: with packed
sequences a long document weighs in proportion to its tokens, as if the documents had been
trained on one by one, and padding (mask 0) counts for nothing. Logits are upcast to float32
before the softmax whatever their dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxstack.optlib._src.errors import ConfigError


def check_loss_options(z_loss_weight: float, label_smoothing: float) -> None:
    if not z_loss_weight >= 0.0:  # also rejects NaN
        raise ConfigError(f"z_loss_weight must be >= 0, got {z_loss_weight}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ConfigError(f"label_smoothing must be in [0, 1), got {label_smoothing}")


def token_terms(logits: jax.Array, targets: jax.Array, label_smoothing: float):
    """Per-token (loss term, negative log-likelihood, logsumexp) from float32 logits [..., V]."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = lse - target_logit
    if label_smoothing:
        # Cross-entropy against (1 - eps) * one_hot + eps / V.
        smoothed = (1.0 - label_smoothing) * target_logit + label_smoothing * logits.mean(-1)
        return lse - smoothed, nll, lse
    return nll, nll, lse


def reduce_terms(sum_loss, sum_nll, sum_z, num_tokens, z_loss_weight):
    denominator = jnp.maximum(num_tokens, 1.0)
    z_loss = z_loss_weight * sum_z / denominator
    loss = sum_loss / denominator + z_loss
    metrics = {"cross_entropy": sum_nll / denominator, "z_loss": z_loss, "num_tokens": num_tokens}
    return loss, metrics


def mask_or_ones(loss_mask: jax.Array | None, targets: jax.Array) -> jax.Array:
    if loss_mask is None:
        return jnp.ones(targets.shape, jnp.float32)
    if loss_mask.shape != targets.shape:
        raise ConfigError(
            f"loss_mask shape {loss_mask.shape} differs from targets shape {targets.shape}"
        )
    return loss_mask.astype(jnp.float32)


def cross_entropy_loss(
    logits: jax.Array,
    targets: jax.Array,
    loss_mask: jax.Array | None = None,
    *,
    z_loss_weight: float = 0.0,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-weighted mean cross-entropy over the tokens `loss_mask` keeps.

    Args:
      logits: [..., V] (any float dtype; computed in float32).
      targets: [...] int token ids.
      loss_mask: [...] weights (1 = train on this token, 0 = ignore); None keeps every token.
      z_loss_weight: adds `z_loss_weight * logsumexp(logits)**2` per token (PaLM's z-loss),
        which keeps the softmax normaliser near 1 and the logits from drifting.
      label_smoothing: eps of the smoothed target distribution `(1-eps)*onehot + eps/V`.

    Returns:
      `(loss, metrics)`: loss = smoothed cross-entropy + z-loss, averaged over kept tokens;
      metrics `cross_entropy` (the plain negative log-likelihood, for perplexity), `z_loss` (the
      weighted term added to the loss) and `num_tokens` (the sum of the mask).

    Example:
      >>> loss, m = cross_entropy_loss(jnp.zeros((1, 2, 4)), jnp.array([[1, 2]]))
      >>> round(float(loss), 4)  # log(4)
      1.3863
    """
    check_loss_options(z_loss_weight, label_smoothing)
    mask = mask_or_ones(loss_mask, targets)
    per_token, nll, lse = token_terms(logits.astype(jnp.float32), targets, label_smoothing)
    return reduce_terms(
        jnp.sum(per_token * mask),
        jnp.sum(nll * mask),
        jnp.sum(lse * lse * mask),
        jnp.sum(mask),
        z_loss_weight,
    )
