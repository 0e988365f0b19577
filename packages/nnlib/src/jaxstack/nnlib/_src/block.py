"""One pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x)).

Gemma 2's "sandwich" adds a norm after each sub-block as well; MoE models swap the MLP for a
MoE block, whose auxiliary losses come back as the third output.
"""

from __future__ import annotations

import jax
from flax import nnx

from jaxstack.nnlib._src.attention import Attention
from jaxstack.nnlib._src.config import ModelConfig, dtype_of
from jaxstack.nnlib._src.mlp import GatedMLP
from jaxstack.nnlib._src.moe import MoE
from jaxstack.nnlib._src.norm import RMSNorm


class Block(nnx.Module):
    """One pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`.

    With `sandwich_norm` (Gemma 2) a norm follows each sub-block as well; MoE configs use a `MoE`
    block in place of the `GatedMLP`.

    Call: `block(x, positions, segment_ids, *, attention_fn, sliding_window, cache=None, layer=0)`
    -> `(x, cache, aux)`, where aux holds the MoE auxiliary losses ({} for a dense MLP).

    Args:
      config: the ModelConfig.
      rngs: nnx.Rngs for parameter initialisation.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config

        def norm():
            return RMSNorm(
                c.d_model,
                eps=c.norm_eps,
                plus_one=c.norm_plus_one,
                param_dtype=dtype_of(c.param_dtype),
            )

        self.attn_norm = norm()
        self.attn = Attention(c, rngs=rngs)
        self.post_attn_norm = norm() if c.sandwich_norm else None
        self.mlp_norm = norm()
        if c.is_moe:
            self.moe, self.mlp = MoE(c, rngs=rngs), None
        else:
            self.moe, self.mlp = None, GatedMLP(c, rngs=rngs)
        self.post_mlp_norm = norm() if c.sandwich_norm else None

    def __call__(
        self,
        x,
        positions,
        segment_ids,
        *,
        attention_fn,
        sliding_window,
        cache=None,
        layer: int | jax.Array = 0,
    ):
        h, cache = self.attn(
            self.attn_norm(x),
            positions,
            segment_ids,
            attention_fn=attention_fn,
            sliding_window=sliding_window,
            cache=cache,
            layer=layer,
        )
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        x = x + h
        h = self.mlp_norm(x)
        if self.moe is not None:
            h, aux = self.moe(h, segment_ids)
        else:
            h, aux = self.mlp(h), {}
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
        return x + h, cache, aux
