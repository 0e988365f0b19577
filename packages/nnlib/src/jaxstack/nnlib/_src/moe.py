"""Mixture-of-experts MLP (Mixtral / Qwen-MoE style): top-k router, dropless experts.

Dropless by construction: every (token, expert) assignment is computed. Assignments are sorted
by expert so each expert's tokens are contiguous, then one `jax.lax.ragged_dot` per projection
runs all experts over their variable-sized groups; nothing is padded to a capacity and no token
is dropped. The auxiliary losses (Switch/Mixtral load balance, ST-MoE router z-loss) are returned
to the caller, who chooses their weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstack.nnlib._src.config import ModelConfig, dtype_of
from jaxstack.nnlib._src.dense import Dense
from jaxstack.nnlib._src.init import normal
from jaxstack.nnlib._src.mlp import activation


class MoE(nnx.Module):
    """Mixture-of-experts MLP (Mixtral / Qwen-MoE style): a top-k router over `num_experts` gated
    MLPs, dropless (no capacity, no token dropped).

    Call: `moe(x, segment_ids)` -> `(y, aux)`: y shaped like x [B, T, d_model], aux the
    auxiliary losses `moe_load_balance_loss` and `moe_router_z_loss` (over real tokens), whose
    weights the caller chooses. `config.moe_impl` picks "ragged" (tokens sorted by expert, one
    `jax.lax.ragged_dot` per projection) or "dense" (every expert on every token).

    Args:
      config: the ModelConfig (`num_experts`, `experts_per_token`, `router_renormalize`, ...).
      rngs: nnx.Rngs for parameter initialisation.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        pdt, self.dtype = dtype_of(c.param_dtype), dtype_of(c.dtype)
        self.num_experts, self.top_k = c.num_experts, c.experts_per_token
        self.renormalize, self.act, self.impl = c.router_renormalize, c.activation, c.moe_impl
        self.router = Dense(
            (c.d_model,),
            (c.num_experts,),
            in_axes=("embed",),
            out_axes=("experts",),
            init_std=c.init_std,
            dtype=jnp.float32,
            param_dtype=pdt,
            rngs=rngs,
        )

        def init(shape):
            return normal(rngs.params(), shape, pdt, c.init_std)

        e, d, f = c.num_experts, c.d_model, c.mlp_dim
        self.gate_proj = nnx.Param(init((e, d, f)), logical_axes=("experts", "embed", "mlp"))
        self.up_proj = nnx.Param(init((e, d, f)), logical_axes=("experts", "embed", "mlp"))
        self.down_proj = nnx.Param(init((e, f, d)), logical_axes=("experts", "mlp", "embed"))

    def route(self, x: jax.Array):
        """Router logits [N, E] (f32), top-k weights [N, k] and expert ids [N, k]."""
        logits = self.router(x.astype(jnp.float32))
        probs = jax.nn.softmax(logits, axis=-1)
        weights, experts = jax.lax.top_k(probs, self.top_k)
        if self.renormalize:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return logits, probs, weights, experts

    def __call__(
        self, x: jax.Array, segment_ids: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        b, t, d = x.shape
        xf = x.reshape(b * t, d)
        logits, probs, weights, experts = self.route(xf)
        aux = self.aux_losses(logits, probs, experts, segment_ids.reshape(-1))
        if self.impl == "dense":
            return self.dense_experts(xf, weights, experts).reshape(b, t, d), aux
        k = self.top_k
        flat_experts = experts.reshape(-1)  # [N*k]
        order = jnp.argsort(flat_experts, stable=True)
        group_sizes = jnp.bincount(flat_experts, length=self.num_experts).astype(jnp.int32)
        xs = xf.astype(self.dtype)[order // k]
        gate = jax.lax.ragged_dot(xs, self.gate_proj[...].astype(self.dtype), group_sizes)
        up = jax.lax.ragged_dot(xs, self.up_proj[...].astype(self.dtype), group_sizes)
        h = activation(self.act)(gate) * up
        ys = jax.lax.ragged_dot(h, self.down_proj[...].astype(self.dtype), group_sizes)
        y = jnp.zeros_like(ys).at[order].set(ys).reshape(b * t, k, d)
        y = jnp.einsum("nkd,nk->nd", y, weights.astype(self.dtype))
        return y.reshape(b, t, d), aux

    def dense_experts(self, xf, weights, experts):
        """Every expert on every token, combined with the (mostly zero) routing weights."""
        combine = jnp.zeros((xf.shape[0], self.num_experts), self.dtype)
        combine = combine.at[jnp.arange(xf.shape[0])[:, None], experts].add(
            weights.astype(self.dtype)
        )
        x = xf.astype(self.dtype)
        gate = jnp.einsum("nd,edf->nef", x, self.gate_proj[...].astype(self.dtype))
        up = jnp.einsum("nd,edf->nef", x, self.up_proj[...].astype(self.dtype))
        h = activation(self.act)(gate) * up * combine[:, :, None]
        return jnp.einsum("nef,efd->nd", h, self.down_proj[...].astype(self.dtype))

    def aux_losses(self, logits, probs, experts, segments):
        """Load-balance loss E * sum_e f_e * P_e (f_e: share of assignments, summed over the k
        slots as in HF Mixtral) and router z-loss mean(logsumexp(logits)^2), over real tokens."""
        real = (segments != 0).astype(jnp.float32)
        n = jnp.maximum(jnp.sum(real), 1.0)
        assigned = jax.nn.one_hot(experts, self.num_experts, dtype=jnp.float32).sum(axis=1)
        f = jnp.sum(assigned * real[:, None], axis=0) / n
        p = jnp.sum(probs * real[:, None], axis=0) / n
        z = jax.nn.logsumexp(logits, axis=-1)
        return {
            "moe_load_balance_loss": self.num_experts * jnp.sum(f * p),
            "moe_router_z_loss": jnp.sum(z * z * real) / n,
        }
