"""Validation perplexity, and the jitted forward pass shared with calibration."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstack import datalib


def forward(model: nnx.Module) -> tuple[Callable[..., jax.Array], Any]:
    """`(fn, state)`: `fn(state, tokens, positions, segment_ids)` -> logits, jitted.

    The whole model state is an argument (quantised weights included), so nothing is baked
    into the compiled program as a constant.
    """
    graphdef, state = nnx.split(model)

    @jax.jit
    def fn(state, tokens, positions, segment_ids):
        return nnx.merge(graphdef, state)(tokens, positions, segment_ids)[0]

    return fn, state


def validation_batches(
    tokenizer: Any,
    *,
    seq_len: int,
    batch_size: int,
    data_path: str | None = None,
    split: str = "validation",
) -> datalib.LMBatchIterator:
    """Fixed-order batches of the default corpus's `split`, or of the text at `data_path`."""
    if data_path is None:
        source = datalib.default_corpus(split=split)
    else:
        p = pathlib.Path(data_path)
        source = datalib.TextSource(str(p / "**" / "*.txt") if p.is_dir() else str(p))
    return datalib.lm_batches(
        source, tokenizer, seq_len=seq_len, batch_size=batch_size, seed=0, shuffle=False
    )


def perplexity(model: nnx.Module, batches: Any, num_batches: int) -> dict[str, Any]:
    """Token-weighted cross-entropy and its exp over `num_batches` batches.

    Also each batch's mean loss and token count (`batch_losses`, `batch_tokens`): two models
    read on the same batches differ per batch, and the spread of those paired differences is
    what tells a real perplexity change from batch-to-batch noise.
    """
    fn, state = forward(model)

    @jax.jit
    def loss_sum(state, batch):
        logits = fn(state, batch["tokens"], batch["positions"], batch["segment_ids"])
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
        return jnp.sum(nll * batch["loss_mask"]), jnp.sum(batch["loss_mask"])

    sums, counts = [], []
    for _ in range(num_batches):
        s, n = loss_sum(state, next(batches))
        sums.append(float(s))
        counts.append(float(n))
    loss = sum(sums) / sum(counts)
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "tokens": sum(counts),
        "batch_losses": [s / n for s, n in zip(sums, counts, strict=True)],
        "batch_tokens": counts,
    }
