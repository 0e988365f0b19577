"""LoRA surgery: attach, merge/unmerge, save/load adapters alone as safetensors.

Adapters live *inside* the Dense they adapt (`.../q_proj/lora/a`, `.../q_proj/lora/b`), so the
base kernel keeps its path (`.../q_proj/kernel`) and HF import/export, sharding rules and
checkpoints of the base model keep working with adapters attached. Adapter params are
nnx.LoRAParam (a subclass of nnx.Param), so `as_function(model, wrt=nnx.LoRAParam)` trains only
them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack.nnlib._src.dense import Dense
from jaxstack.nnlib._src.errors import SurgeryError
from jaxstack.nnlib._src.lora_module import LoRA
from jaxstack.nnlib._src.paths import iter_variables
from jaxstack.nnlib._src.safetensors_io import open_safetensors, save_safetensors
from jaxstack.nnlib._src.surgery import Frozen, _matching, iter_modules

WEIGHTS = nnx.All(nnx.Any(nnx.Param, Frozen), nnx.Not(nnx.LoRAParam))


def apply_lora(
    model: nnx.Module,
    pattern: str,
    *,
    rank: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    rngs: nnx.Rngs | None = None,
) -> list[str]:
    """Attach a LoRA adapter to every Dense whose module path matches `pattern`.

    Example: `apply_lora(model, r"attn/(q|v)_proj$", rank=8, alpha=16)`.
    alpha defaults to rank (scale 1). Returns the adapted module paths.
    """
    if rank <= 0:
        raise SurgeryError(f"LoRA rank={rank} must be positive")
    if not 0.0 <= dropout < 1.0:
        raise SurgeryError(f"LoRA dropout={dropout} must be in [0, 1)")
    rngs = rngs or nnx.Rngs(0)
    found = _matching(model, pattern, Dense)
    for _, dense in found:
        n_in, n_out = len(dense.in_features), len(dense.out_features)
        k = dense.kernel[...]
        lead = tuple(k.shape[: k.ndim - n_in - n_out])
        dense.lora = LoRA(
            int(np.prod(dense.in_features)),
            int(np.prod(dense.out_features)),
            rank=rank,
            alpha=float(rank if alpha is None else alpha),
            dropout=dropout,
            lead=lead,
            dtype=dense.dtype,
            param_dtype=k.dtype,
            rngs=rngs,
        )
    return [p for p, _ in found]


def _adapted(model: nnx.Module) -> list[tuple[str, Dense]]:
    return [(p, m) for p, m in iter_modules(model) if isinstance(m, Dense) and m.lora is not None]


def _kernel_delta(dense: Dense) -> jax.Array:
    k = dense.kernel[...]
    return dense.lora.delta().reshape(k.shape).astype(k.dtype)


def merge_lora(model: nnx.Module) -> list[str]:
    """Fold every adapter into its kernel (kernel += a @ b * scale) and remove the adapters."""
    paths = []
    for path, dense in _adapted(model):
        dense.kernel[...] = dense.kernel[...] + _kernel_delta(dense)
        dense.lora = None
        paths.append(path)
    return paths


def unmerge_lora(model: nnx.Module, adapters: str | os.PathLike) -> list[str]:
    """Undo `merge_lora`: subtract the adapters saved at `adapters` and re-attach them."""
    paths = load_lora(model, adapters)
    for _, dense in _adapted(model):
        dense.kernel[...] = dense.kernel[...] - _kernel_delta(dense)
    return paths


def lora_state(model: nnx.Module) -> nnx.State:
    """The LoRA adapter weights of `model` alone (its `nnx.LoRAParam` variables), as an nnx.State.

    This is what a LoRA fine-tune differentiates and optimises, and what `save_lora` writes; the
    base weights stay out of it.

    Example:
        apply_lora(model, r"attn/(q|v)_proj$", rank=8)
        adapters = lora_state(model)  # leaves layers/0/attn/q_proj/lora/a, .../lora/b, ...
    """
    return nnx.state(model, nnx.LoRAParam)


def save_lora(model: nnx.Module, path: str | os.PathLike) -> None:
    """Save only the adapters (safetensors, keys = param paths; rank/alpha/dropout in metadata)."""
    adapted = _adapted(model)
    if not adapted:
        raise SurgeryError("the model has no LoRA adapters to save; call apply_lora first")
    spec = {
        p: {"rank": d.lora.rank, "alpha": d.lora.alpha, "dropout": d.lora.rate} for p, d in adapted
    }
    tensors = {p: np.asarray(v[...]) for p, v in iter_variables(lora_state(model))}
    save_safetensors(
        tensors, path, metadata={"format": "jaxstack-nnlib-lora", "adapters": json.dumps(spec)}
    )


def load_lora(model: nnx.Module, path: str | os.PathLike) -> list[str]:
    """Attach (if needed) and fill the adapters saved by `save_lora`; returns adapted paths."""
    f = open_safetensors(path)
    spec = json.loads((f.metadata() or {}).get("adapters", "{}"))
    if not spec:
        raise SurgeryError(f"{path} holds no jaxstack-nnlib LoRA adapters")
    for module_path, s in spec.items():
        modules = dict(iter_modules(model))
        if module_path not in modules or not isinstance(modules[module_path], Dense):
            raise SurgeryError(f"adapter for {module_path!r} has no matching Dense in this model")
        if modules[module_path].lora is None:
            apply_lora(
                model,
                "^" + re.escape(module_path) + "$",
                rank=s["rank"],
                alpha=s["alpha"],
                dropout=s["dropout"],
            )
    state = lora_state(model)
    stored = set(f.keys())
    for p, var in iter_variables(state):
        if p not in stored:
            raise SurgeryError(f"{path} lacks adapter tensor {p!r}")
        value = f.get_tensor(p)
        if value.shape != var.shape:
            raise SurgeryError(
                f"adapter {p!r}: file shape {value.shape}, model expects {var.shape}"
            )
        var[...] = jnp.asarray(value, var.dtype)
    nnx.update(model, state)
    return list(spec)


def set_lora_dropout_rng(model: nnx.Module, key: jax.Array | None) -> None:
    """Give every adapter a fresh dropout key derived from `key` (None turns dropout off)."""
    for i, (_, dense) in enumerate(_adapted(model)):
        lora = dense.lora
        if key is None:
            lora.dropout_active = False
            continue
        lead = lora.dropout_key.shape[:-1]
        k = jax.random.fold_in(key, i)
        if lead:
            k = jax.random.split(k, int(np.prod(lead))).reshape(lead)
        lora.dropout_key[...] = jax.random.key_data(k)
        lora.dropout_active = True


def merged_kernels(model: nnx.Module) -> dict[str, Any]:
    """Path -> array of the base weights (frozen included) with adapters folded in."""
    arrays = {p: v[...] for p, v in iter_variables(nnx.state(model, WEIGHTS))}
    for path, dense in _adapted(model):
        key = f"{path}/kernel"
        arrays[key] = arrays[key] + _kernel_delta(dense)
    return arrays
