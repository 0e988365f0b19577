"""Dense: a linear map whose kernel keeps the model's natural axes ([embed, heads, head_dim] ...).

Keeping heads as their own axis (rather than one flat [embed, heads*head_dim] matrix) is what
lets every parameter carry logical axis names for sharding, and lets surgery (LoRA,
quantisation) treat every projection the same way: contract the first `len(in_features)` kernel
axes with the last axes of the input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstack.nnlib._src.init import normal


class Dense(nnx.Module):
    """y = x @ kernel (+ bias), with multi-axis inputs and outputs."""

    def __init__(
        self,
        in_features: Sequence[int],
        out_features: Sequence[int],
        *,
        in_axes: Sequence[str | None],
        out_axes: Sequence[str | None],
        use_bias: bool = False,
        init_std: float = 0.02,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.in_features = tuple(in_features)
        self.out_features = tuple(out_features)
        self.dtype = dtype
        shape = self.in_features + self.out_features
        init = normal(rngs.params(), shape, param_dtype, init_std)
        self.kernel = nnx.Param(init, logical_axes=tuple(in_axes) + tuple(out_axes))
        if use_bias:
            self.bias = nnx.Param(
                jnp.zeros(self.out_features, param_dtype), logical_axes=tuple(out_axes)
            )
        else:
            self.bias = None
        self.lora = nnx.data(None)  # a LoRA adapter, attached by jaxstack.nnlib.apply_lora

    def __call__(self, x: jax.Array) -> jax.Array:
        n_in = len(self.in_features)
        lead = x.shape[: x.ndim - n_in]
        d_in, d_out = math.prod(self.in_features), math.prod(self.out_features)
        k = self.kernel[...].astype(self.dtype).reshape(d_in, d_out)
        x = x.astype(self.dtype).reshape(*lead, d_in)
        # One 2-D matmul over all tokens: with the leading [batch, seq] axes flattened, XLA CPU
        # runs the weight-gradient matmul (contracting over tokens) without first copying the
        # activations into a transposed 3-D layout; a d256 train step is ~13-16% faster.
        y = x.reshape(-1, d_in) @ k
        if self.lora is not None:
            y = y + self.lora(x).reshape(y.shape)
        y = y.reshape(*lead, *self.out_features)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y
