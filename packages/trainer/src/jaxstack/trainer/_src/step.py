"""The jitted train and eval steps over the model's pure `apply(params, ...)`.

Training state is the project's convention `{"params", "opt_state", "step"}`. One train step:
forward with `return_aux=True`, token-weighted cross-entropy (+ z-loss) plus weighted MoE
auxiliary losses, gradients (accumulated over `grad_accum` micro-batches with `lax.scan`, each
weighted by its token count so the result equals the full-batch gradient), the Optax update, and
a flat metrics dict. The caller jits it with the state donated, so parameters and optimiser
moments are updated in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

Batch = dict[str, jax.Array]
AUX_KEYS = ("moe_load_balance_loss", "moe_router_z_loss")


def make_loss_fn(
    apply: Callable[..., Any],
    *,
    z_loss_weight: float = 0.0,
    aux_weights: dict[str, float] | None = None,
) -> Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]]:
    """`loss_fn(params, batch) -> (total_loss, metrics)` with metrics as scalars."""
    from jaxstack.optlib import cross_entropy_loss

    aux_weights = aux_weights or {}

    def loss_fn(params: Any, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        logits, _, aux = apply(
            params,
            batch["tokens"],
            batch["positions"],
            batch["segment_ids"],
            return_aux=True,
        )
        loss, parts = cross_entropy_loss(
            logits.astype(jnp.float32),
            batch["targets"],
            batch["loss_mask"],
            z_loss_weight=z_loss_weight,
        )
        metrics = {
            "cross_entropy": parts["cross_entropy"],
            "z_loss": parts["z_loss"],
            "num_tokens": parts["num_tokens"].astype(jnp.float32),
        }
        total = loss
        for key in AUX_KEYS:
            if key in aux:
                total = total + aux_weights.get(key, 0.0) * aux[key]
                metrics[key] = aux[key]
        return total, metrics

    return loss_fn


def make_train_step(
    loss_fn: Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]],
    tx: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
) -> Callable[[dict[str, Any], Batch], tuple[dict[str, Any], dict[str, jax.Array]]]:
    """`step(state, batch) -> (new_state, metrics)`; pure, to be jitted with state donated."""
    from jaxstack.optlib import current_learning_rate

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def gradients(params: Any, batch: Batch) -> tuple[jax.Array, Any, dict[str, jax.Array]]:
        if grad_accum == 1:
            (loss, metrics), grads = grad_fn(params, batch)
            return loss, grads, metrics
        # Micro-batch i takes rows i, i+A, i+2A, ...: each device's rows split evenly, so the
        # split needs no communication whatever the data-parallel layout.
        micro = jax.tree.map(
            lambda x: jnp.swapaxes(x.reshape(-1, grad_accum, *x.shape[1:]), 0, 1), batch
        )

        def body(carry: Any, mb: Batch) -> tuple[Any, dict[str, jax.Array]]:
            (loss, metrics), grads = grad_fn(params, mb)
            w = metrics["num_tokens"]
            carry = jax.tree.map(lambda acc, g: acc + g * w, carry, grads)
            return carry, {"loss": loss, **metrics}

        zeros = jax.tree.map(jnp.zeros_like, params)
        summed, per_micro = jax.lax.scan(body, zeros, micro)
        total = jnp.maximum(per_micro["num_tokens"].sum(), 1.0)
        grads = jax.tree.map(lambda g: g / total, summed)
        weights = per_micro["num_tokens"] / total
        metrics = {k: (v * weights).sum() for k, v in per_micro.items() if k != "num_tokens"}
        metrics["num_tokens"] = per_micro["num_tokens"].sum()
        return metrics.pop("loss"), grads, metrics

    def step(state: dict[str, Any], batch: Batch) -> tuple[dict[str, Any], dict[str, jax.Array]]:
        params = state["params"]
        loss, grads, metrics = gradients(params, batch)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": loss, "grad_norm": grad_norm, **metrics}
        lr = current_learning_rate(opt_state)
        if lr is not None:
            metrics["learning_rate"] = jnp.asarray(lr, jnp.float32)
        new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1}
        return new_state, metrics

    return step


def make_eval_step(
    loss_fn: Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]],
) -> Callable[[Any, Batch], dict[str, jax.Array]]:
    """`eval_step(params, batch) -> {"loss_sum", "num_tokens"}` for token-weighted averaging."""

    def eval_step(params: Any, batch: Batch) -> dict[str, jax.Array]:
        _, metrics = loss_fn(params, batch)
        n = metrics["num_tokens"]
        return {"loss_sum": metrics["cross_entropy"] * n, "num_tokens": n}

    return eval_step
