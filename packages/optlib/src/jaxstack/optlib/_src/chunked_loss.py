"""Cross-entropy straight from the final hidden states, chunk by chunk over the tokens.

The naive loss computes `logits = hidden @ unembedding` as one [B, T, V] float32 array (8 GiB
at B=8, T=2048, V=128k) and its backward pass keeps as much again. Here the tokens are cut into
chunks of `chunk_size`, and a `lax.scan` computes each chunk's logits, reduces them to three
per-chunk sums and drops them. A custom VJP keeps only the per-token logsumexp from the forward
pass; the backward pass recomputes each chunk's logits, turns them into the logit gradient
(softmax minus target, with the z-loss, smoothing and soft-cap terms) and feeds the two matmuls
of the projection's gradient, accumulating the [d, V] weight gradient in float32. Peak memory is
a few [chunk_size, V] buffers plus that accumulator, independent of B*T.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxstack.optlib._src.errors import ConfigError
from jaxstack.optlib._src.losses import check_loss_options, mask_or_ones, reduce_terms


def chunked_cross_entropy_loss(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    loss_mask: jax.Array | None = None,
    *,
    chunk_size: int = 1024,
    z_loss_weight: float = 0.0,
    logits_soft_cap: float | None = None,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`cross_entropy_loss(hidden @ unembedding, ...)` without ever holding all the logits.

    Args:
      hidden: [..., d] final hidden states (after the final norm).
      unembedding: [d, V] output projection (for tied embeddings pass `embedding.T`).
      targets, loss_mask, z_loss_weight, label_smoothing: as in `cross_entropy_loss`.
      chunk_size: tokens per chunk; memory grows with `chunk_size * V`, speed falls when it is
        too small to keep the matmul busy. The token count need not divide it (the tail chunk
        is padded with masked tokens).
      logits_soft_cap: if set, logits become `cap * tanh(logits / cap)` (Gemma 2).

    Returns:
      `(loss, metrics)` exactly as `cross_entropy_loss` (same keys, same averaging); gradients
      flow to `hidden` and `unembedding` (not to `loss_mask`). The matmuls run in the inputs'
      dtype with float32 results; the weight gradient is accumulated over chunks in float32.
    """
    check_loss_options(z_loss_weight, label_smoothing)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ConfigError(f"logits_soft_cap must be > 0 or None, got {logits_soft_cap}")
    if hidden.shape[-1] != unembedding.shape[0] or unembedding.ndim != 2:
        raise ConfigError(
            f"unembedding must be [d, V] with d = hidden.shape[-1] = {hidden.shape[-1]}, got "
            f"{unembedding.shape} (for tied embeddings pass embedding.T)"
        )
    mask = mask_or_ones(loss_mask, targets)
    d = hidden.shape[-1]
    h = hidden.reshape(-1, d)
    t = targets.reshape(-1)
    m = mask.reshape(-1)
    num_tokens = jnp.sum(m)
    chunk_size = min(chunk_size, h.shape[0])
    pad = -h.shape[0] % chunk_size
    if pad:
        h = jnp.pad(h, ((0, pad), (0, 0)))
        t = jnp.pad(t, (0, pad))
        m = jnp.pad(m, (0, pad))
    n_chunks = h.shape[0] // chunk_size
    xs = (
        h.reshape(n_chunks, chunk_size, d),
        t.reshape(n_chunks, chunk_size),
        m.reshape(n_chunks, chunk_size),
    )

    sums = _chunk_sums(logits_soft_cap, label_smoothing)(*xs, unembedding)
    return reduce_terms(sums[0], sums[1], sums[2], num_tokens, z_loss_weight)


def _chunk_sums(soft_cap: float | None, smoothing: float):
    """f(h [n, C, d], t [n, C], m [n, C], w [d, V]) -> [sum of loss terms, of nll, of lse^2]."""

    def logits_of(h_c, w):
        raw = jnp.dot(h_c, w, preferred_element_type=jnp.float32)
        if soft_cap is None:
            return raw, None
        squashed = jnp.tanh(raw / soft_cap)
        return soft_cap * squashed, squashed

    def forward_chunk(w, h_c, t_c, m_c):
        logits, _ = logits_of(h_c, w)
        lse = jax.nn.logsumexp(logits, axis=-1)
        target = jnp.take_along_axis(logits, t_c[:, None], axis=-1)[:, 0]
        nll = lse - target
        loss = nll
        if smoothing:
            loss = lse - (1.0 - smoothing) * target - smoothing * logits.mean(-1)
        sums = jnp.stack([jnp.sum(loss * m_c), jnp.sum(nll * m_c), jnp.sum(lse * lse * m_c)])
        return sums, lse

    def forward(h, t, m, w):
        def body(carry, chunk):
            sums, lse = forward_chunk(w, *chunk)
            return carry + sums, lse

        sums, lse = jax.lax.scan(body, jnp.zeros(3, jnp.float32), (h, t, m))
        return sums, (h, t, m, w, lse)

    def backward(residuals, g):
        h, t, m, w, lse = residuals
        g_loss, g_nll, g_z = g[0], g[1], g[2]
        vocab = w.shape[1]

        def body(dw, chunk):
            h_c, t_c, m_c, lse_c = chunk
            logits, squashed = logits_of(h_c, w)
            p = jnp.exp(logits - lse_c[:, None])
            is_target = jnp.arange(vocab)[None, :] == t_c[:, None]
            # d(sum of terms)/d logits, per token, for the three weighted sums.
            p_coef = (g_loss + g_nll + 2.0 * g_z * lse_c) * m_c
            target_coef = (g_loss * (1.0 - smoothing) + g_nll) * m_c
            dlogits = p_coef[:, None] * p - jnp.where(is_target, target_coef[:, None], 0.0)
            if smoothing:
                dlogits = dlogits - (g_loss * smoothing / vocab) * m_c[:, None]
            if squashed is not None:
                dlogits = dlogits * (1.0 - squashed * squashed)
            dlogits = dlogits.astype(w.dtype)
            dh_c = jnp.dot(dlogits, w.T, preferred_element_type=jnp.float32).astype(h_c.dtype)
            dw = dw + jnp.dot(h_c.T, dlogits, preferred_element_type=jnp.float32)
            return dw, dh_c

        dw, dh = jax.lax.scan(body, jnp.zeros(w.shape, jnp.float32), (h, t, m, lse))
        return dh, None, None, dw.astype(w.dtype)

    f = jax.custom_vjp(lambda h, t, m, w: forward(h, t, m, w)[0])
    f.defvjp(forward, backward)
    return f
