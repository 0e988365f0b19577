"""Transformer: token embedding, a stack of decoder blocks, final norm, output projection.

Layers are either a list (`layers/3/attn/q_proj/kernel`) or, with `config.scan_layers`, one
stacked block whose params have a leading "layers" axis (`layers/attn/q_proj/kernel`
[L, ...]) run by `jax.lax.scan`, so compile time does not grow with depth. Each layer is applied
through split/merge inside the traced function, never through graph-mode NNX transforms, so
under `jax.jit` the model costs what the same pure-JAX code would.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstack.nnlib._src.attention_fn import AttentionFn, dot_product_attention
from jaxstack.nnlib._src.block import Block
from jaxstack.nnlib._src.config import ModelConfig, dense_options, dtype_of
from jaxstack.nnlib._src.dense import Dense
from jaxstack.nnlib._src.errors import ConfigError
from jaxstack.nnlib._src.init import normal
from jaxstack.nnlib._src.norm import RMSNorm

AUX_KEYS = ("moe_load_balance_loss", "moe_router_z_loss")


def remat_policy(name: str):
    """The jax.checkpoint wrapper for a config's `remat` name (None for "none")."""
    if name == "none":
        return None
    if name == "full":
        return lambda f: jax.checkpoint(f)
    return lambda f: jax.checkpoint(f, policy=jax.checkpoint_policies.checkpoint_dots)


class Transformer(nnx.Module):
    """Decoder-only transformer for every family of ModelConfig.

    Call: `model(tokens, positions, segment_ids=None, cache=None, *, return_aux=False)` ->
    `(logits, cache)` or `(logits, cache, aux)`. Logits are float32 [B, T, vocab].

    Args:
      config: the ModelConfig.
      rngs: nnx.Rngs for parameter initialisation.
      attention_fn: full-sequence attention (see `AttentionFn`); default plain XLA.
    """

    def __init__(
        self, config: ModelConfig, *, rngs: nnx.Rngs, attention_fn: AttentionFn | None = None
    ):
        c = config
        windows = c.layer_windows()
        if c.scan_layers and len(set(windows)) > 1:
            raise ConfigError(
                f"scan_layers=True needs one attention window for every layer, got {set(windows)} "
                "from layer_types; set scan_layers=False for this model"
            )
        self.config = c
        self.attention_fn = attention_fn or dot_product_attention
        pdt = dtype_of(c.param_dtype)
        emb = normal(rngs.params(), (c.vocab_size, c.d_model), pdt, c.init_std)
        self.embed = nnx.Param(emb, logical_axes=("vocab", "embed"))
        if c.scan_layers:

            @nnx.split_rngs(splits=c.num_layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make_stack(rngs: nnx.Rngs) -> Block:
                return Block(c, rngs=rngs)

            self.layers = make_stack(rngs)
        else:
            self.layers = nnx.List([Block(c, rngs=rngs) for _ in range(c.num_layers)])
        self.final_norm = RMSNorm(
            c.d_model, eps=c.norm_eps, plus_one=c.norm_plus_one, param_dtype=pdt
        )
        if c.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Dense(
                (c.d_model,),
                (c.vocab_size,),
                in_axes=("embed",),
                out_axes=("vocab",),
                **dense_options(c, rngs),
            )

    # ---------------------------------------------------------------------------------------
    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        x = jnp.take(self.embed[...], tokens, axis=0).astype(dtype_of(c.dtype))
        if c.embed_scale:
            x = x * jnp.asarray(math.sqrt(c.d_model), x.dtype)
        return x

    def unembed(self, x: jax.Array) -> jax.Array:
        c = self.config
        if self.lm_head is not None:
            logits = self.lm_head(x)
        else:  # tied: project with the embedding table
            logits = x @ self.embed[...].astype(x.dtype).T
        logits = logits.astype(jnp.float32)
        if c.final_logit_soft_cap is not None:
            logits = c.final_logit_soft_cap * jnp.tanh(logits / c.final_logit_soft_cap)
        return logits

    def hidden_states(self, tokens, positions, segment_ids=None, cache=None):
        """Final-normed hidden states [B, T, d_model] (before the output projection), cache, aux.

        For losses that never materialise full logits (chunked cross-entropy).
        """
        c = self.config
        if segment_ids is None:
            segment_ids = jnp.ones(tokens.shape, jnp.int32)
        x = self.embed_tokens(tokens)
        aux = {k: jnp.zeros((), jnp.float32) for k in AUX_KEYS} if c.is_moe else {}
        windows = c.layer_windows()
        wrap = remat_policy(c.remat)

        def run_layer(state, graphdef, x, cache, layer, window):
            block = nnx.merge(graphdef, state)
            return block(
                x,
                positions,
                segment_ids,
                attention_fn=self.attention_fn,
                sliding_window=window,
                cache=cache,
                layer=layer,
            )

        def add_aux(total, new):
            return {k: total[k] + new[k] for k in total}

        if c.scan_layers:
            graphdef, state = nnx.split(self.layers)

            def body(carry, xs):
                x, cache, aux = carry
                st, layer = xs
                fn = lambda st, x, cache: run_layer(st, graphdef, x, cache, layer, windows[0])
                if wrap is not None:
                    fn = wrap(fn)
                x, cache, a = fn(st, x, cache)
                return (x, cache, add_aux(aux, a)), None

            layer_ids = jnp.arange(c.num_layers, dtype=jnp.int32)
            (x, cache, aux), _ = jax.lax.scan(body, (x, cache, aux), (state, layer_ids))
        else:
            for i, block in enumerate(self.layers):
                graphdef, state = nnx.split(block)
                fn = lambda st, x, cache, i=i, g=graphdef: run_layer(st, g, x, cache, i, windows[i])
                if wrap is not None:
                    fn = wrap(fn)
                x, cache, a = fn(state, x, cache)
                aux = add_aux(aux, a)
        aux = {k: v / c.num_layers for k, v in aux.items()}
        if cache is not None:
            cache = cache.advance(positions, segment_ids)
        return self.final_norm(x), cache, aux

    def __call__(
        self, tokens, positions, segment_ids=None, cache=None, *, return_aux: bool = False
    ):
        x, cache, aux = self.hidden_states(tokens, positions, segment_ids, cache)
        logits = self.unembed(x)
        return (logits, cache, aux) if return_aux else (logits, cache)
