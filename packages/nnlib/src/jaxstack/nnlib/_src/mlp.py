"""Gated MLPs: SwiGLU (Llama, Qwen, Mistral) and GeGLU (Gemma), down(act(gate(x)) * up(x))."""

from __future__ import annotations

import jax
from flax import nnx

from jaxstack.nnlib._src.config import ModelConfig, dense_options


def activation(name: str):
    """silu, gelu_tanh (HF gelu_pytorch_tanh) or exact gelu."""
    return {
        "silu": jax.nn.silu,
        "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
        "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    }[name]


class GatedMLP(nnx.Module):
    """The gated MLP of Llama, Qwen and Mistral (SwiGLU) or Gemma (GeGLU):
    `down(act(gate(x)) * up(x))`, with `act` from `config.activation`.

    Call: `mlp(x)` -> an array shaped like x [..., d_model].

    Args:
      config: the ModelConfig (`d_model`, `mlp_dim`, `activation`, dtypes).
      rngs: nnx.Rngs for parameter initialisation.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        from jaxstack.nnlib._src.dense import Dense

        c = config
        kw = dense_options(c, rngs)
        self.gate_proj = Dense(
            (c.d_model,), (c.mlp_dim,), in_axes=("embed",), out_axes=("mlp",), **kw
        )
        self.up_proj = Dense(
            (c.d_model,), (c.mlp_dim,), in_axes=("embed",), out_axes=("mlp",), **kw
        )
        self.down_proj = Dense(
            (c.mlp_dim,), (c.d_model,), in_axes=("mlp",), out_axes=("embed",), **kw
        )
        self.act = c.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(activation(self.act)(self.gate_proj(x)) * self.up_proj(x))
