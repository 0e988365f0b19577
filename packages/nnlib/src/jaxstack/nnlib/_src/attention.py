"""Self-attention block: projections, optional q/k norm, RoPE, then the attention function.

MHA, GQA and MQA are the same code: num_kv_heads divides num_heads. Without a cache the
pluggable `attention_fn` runs over the full sequence (training, prefill); with a cache, the
cache's own `attend` does the masked attention over cached + new tokens.
"""

from __future__ import annotations

import jax
from flax import nnx

from jaxstack.nnlib._src.attention_fn import AttentionFn
from jaxstack.nnlib._src.config import ModelConfig, dense_options, dtype_of
from jaxstack.nnlib._src.dense import Dense
from jaxstack.nnlib._src.norm import RMSNorm
from jaxstack.nnlib._src.rope import apply_rope, inverse_frequencies


class Attention(nnx.Module):
    """Self-attention of one decoder layer: q/k/v projections, optional q/k RMSNorm, RoPE, the
    attention itself, then the output projection.

    MHA, GQA and MQA are the same module (`num_kv_heads` divides `num_heads`). Without a cache the
    layer's `attention_fn` runs over the whole sequence (training, prefill); with a cache, the
    cache's own `attend` does the masked attention over cached and new tokens.

    Call: `attn(x, positions, segment_ids, *, attention_fn, sliding_window, cache=None, layer=0)`
    -> `(out, cache)`, x and out [B, T, d_model].

    Args:
      config: the ModelConfig (heads, head_dim, qkv_bias, qk_norm, RoPE, soft cap, dtypes).
      rngs: nnx.Rngs for parameter initialisation.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        kw = dense_options(c, rngs)
        self.q_proj = Dense(
            (c.d_model,),
            (c.num_heads, c.head_dim),
            in_axes=("embed",),
            out_axes=("heads", "head_dim"),
            use_bias=c.qkv_bias,
            **kw,
        )
        kv = dict(in_axes=("embed",), out_axes=("kv_heads", "head_dim"), use_bias=c.qkv_bias, **kw)
        self.k_proj = Dense((c.d_model,), (c.num_kv_heads, c.head_dim), **kv)
        self.v_proj = Dense((c.d_model,), (c.num_kv_heads, c.head_dim), **kv)
        self.o_proj = Dense(
            (c.num_heads, c.head_dim),
            (c.d_model,),
            in_axes=("heads", "head_dim"),
            out_axes=("embed",),
            **kw,
        )
        if c.qk_norm:
            nkw = dict(
                eps=c.norm_eps,
                plus_one=c.norm_plus_one,
                axis_name="head_dim",
                param_dtype=dtype_of(c.param_dtype),
            )
            self.q_norm = RMSNorm(c.head_dim, **nkw)
            self.k_norm = RMSNorm(c.head_dim, **nkw)
        else:
            self.q_norm = self.k_norm = None
        # Static (hashable) RoPE settings; the frequencies are a trace-time NumPy constant.
        self.rope = (c.head_dim, c.rope_theta, tuple(sorted((c.rope_scaling or {}).items())))
        self.scale = c.attention_scale
        self.soft_cap = c.attn_logit_soft_cap

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array,
        *,
        attention_fn: AttentionFn,
        sliding_window: int | None,
        cache=None,
        layer: int | jax.Array = 0,
    ):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        head_dim, theta, scaling = self.rope
        inv_freq = inverse_frequencies(head_dim, theta, dict(scaling) or None)
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)
        if cache is None:
            out = attention_fn(
                q,
                k,
                v,
                segment_ids=segment_ids,
                causal=True,
                sliding_window=sliding_window,
                logits_soft_cap=self.soft_cap,
                scale=self.scale,
            )
        else:
            out, cache = cache.attend(
                layer,
                q,
                k,
                v,
                positions=positions,
                segment_ids=segment_ids,
                sliding_window=sliding_window,
                logits_soft_cap=self.soft_cap,
                scale=self.scale,
            )
        return self.o_proj(out), cache
