"""Several LoRA adapters served over one base model, chosen per request (vLLM's --lora-modules).

Every Dense that some adapter adapts gets a `MultiLoRA` holding all adapters' a and b stacked
(an adapter that leaves the layer alone has zeros there), padded to the largest rank. Each
token row of a step carries the number of its request's adapter (0: the base model); the
module computes the row's x @ a for every adapter, keeps its own adapter's, and multiplies by
the stacked b in one matmul. Requests for different adapters and for the base model so share
one batch and one compiled program, and no adapter is merged into the base weights.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack import nnlib
from jaxstack.serving._src.errors import ConfigError


class AdapterWeight(nnx.Variable):
    """A stacked adapter matrix: served, never trained (not an nnx.Param, so weight updates of
    the base model leave it alone)."""


class AdapterRows(nnx.Variable):
    """The adapter number of each token row of the step being run (set inside the step)."""


class MultiLoRA(nnx.Module):
    """The LoRA updates of several adapters of one Dense: y += x @ a[k] @ b[k] for a row of
    adapter k (k = 1..n; row 0 is the base model, no update). b has the scale folded in."""

    def __init__(self, a: np.ndarray, b: np.ndarray, dtype):
        self.a = AdapterWeight(jnp.asarray(a))  # [n, in, r]
        self.b = AdapterWeight(jnp.asarray(b))  # [n, r, out]
        self.rows = AdapterRows(jnp.zeros((1,), jnp.int32))
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        n, d_in, _ = self.a.shape
        flat = x.reshape(-1, d_in).astype(self.dtype)
        per_adapter = jnp.einsum("ti,nir->tnr", flat, self.a[...].astype(self.dtype))
        own = self.rows[...][:, None] == jnp.arange(1, n + 1)[None, :]  # [T, n]
        kept = jnp.where(own[:, :, None], per_adapter, 0).reshape(flat.shape[0], -1)
        return kept @ self.b[...].astype(self.dtype).reshape(kept.shape[1], -1)


def attach_adapters(
    model: nnx.Module, adapters: Mapping[str, str | os.PathLike]
) -> tuple[str, ...]:
    """Give `model` a MultiLoRA on every Dense one of the PEFT adapters adapts; returns the
    adapter names in the order of their numbers (the first is adapter 1).

    Raises ConfigError for a model with LoRA modules of its own or scanned layers, and for an
    adapter that does not fit the model (nnlib's message, naming the folder).
    """
    if not adapters:
        return ()
    if model.config.scan_layers:
        raise ConfigError("LoRA adapters need a model with scan_layers=False (per-layer Dense)")
    layers = {p: m for p, m in nnlib.iter_modules(model) if isinstance(m, nnlib.Dense)}
    if any(m.lora is not None for m in layers.values()):
        raise ConfigError(
            "the model already has LoRA adapters attached; merge them (nnlib.merge_lora) "
            "before serving others over it"
        )
    read = {}
    for name, folder in adapters.items():
        try:
            read[name] = nnlib.read_peft_adapter(folder, model.config)
        except nnlib.Error as e:
            raise ConfigError(f"LoRA adapter {name!r}: {e}") from None
    names = tuple(adapters)
    rank = max(a.shape[1] for pairs in read.values() for a, _ in pairs.values())
    for path in sorted({p for pairs in read.values() for p in pairs}):
        layer = layers.get(path)
        if layer is None:  # e.g. a quantised layer (quantlib replaces the Dense)
            raise ConfigError(
                f"LoRA adapters adapt {path}, which is not a float Dense layer of this model "
                "(a quantised model?); serve the adapters over the float model"
            )
        d_in, d_out = math.prod(layer.in_features), math.prod(layer.out_features)
        a = np.zeros((len(names), d_in, rank), np.float32)
        b = np.zeros((len(names), rank, d_out), np.float32)
        for k, name in enumerate(names):
            if path not in read[name]:
                continue
            a_k, b_k = read[name][path]
            if a_k.shape[0] != d_in or b_k.shape[1] != d_out:
                raise ConfigError(
                    f"LoRA adapter {name!r}: its {path} is [{a_k.shape[0]} -> {b_k.shape[1]}], "
                    f"the model's [{d_in} -> {d_out}]; it was trained for another model"
                )
            a[k, :, : a_k.shape[1]], b[k, : b_k.shape[0]] = a_k, b_k  # zero-padded rank
        layer.lora = MultiLoRA(a, b, layer.dtype)
    return names


def set_adapter_rows(model: nnx.Module, rows: jax.Array) -> None:
    """Tell every MultiLoRA of (a step's copy of) the model which adapter each token row uses."""
    for _, module in nnlib.iter_modules(model):
        if isinstance(module, MultiLoRA):
            module.rows.set_value(rows)
