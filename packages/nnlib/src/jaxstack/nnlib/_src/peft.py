"""PEFT LoRA adapters (`adapter_config.json` + `adapter_model.safetensors`) on nnlib paths.

PEFT names each LoRA pair after the HF module it adapts: `base_model.model.<module>.lora_A.weight`
[r, in] and `.lora_B.weight` [out, r], where `<module>` is the HF tensor name of a Linear weight
without `.weight`. nnlib's HF name table (the one `load_hf_checkpoint` reads) gives the Dense
each module is, so an adapter trained with `peft` on the transformers model, or exported by
jaxstack-rl, lands on the layer it was trained for.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re

import numpy as np
from flax import nnx

from jaxstack.nnlib._src.config import ModelConfig
from jaxstack.nnlib._src.dense import Dense
from jaxstack.nnlib._src.errors import SurgeryError
from jaxstack.nnlib._src.hf_names import tensor_maps
from jaxstack.nnlib._src.lora import apply_lora
from jaxstack.nnlib._src.safetensors_io import open_safetensors
from jaxstack.nnlib._src.surgery import iter_modules

_PAIR = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")
# adapter_config.json settings that change what the tensors mean, and the value that does not.
_NEUTRAL = {"use_dora": False, "fan_in_fan_out": False, "bias": "none"}


def _dense_modules(config: ModelConfig) -> dict[str, str]:
    """HF module name -> nnlib Dense path, for every HF Linear the model has."""
    return {
        m.hf_names[0].removesuffix(".weight"): m.path.removesuffix("/kernel")
        for m in tensor_maps(config)
        if m.path.endswith("/kernel") and len(m.hf_names) == 1
    }


def _alpha(settings: dict, module: str) -> float:
    """lora_alpha, or the alpha_pattern entry whose key matches the module (PEFT's rule)."""
    for key, alpha in (settings.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?{key}", module):
            return float(alpha)
    return float(settings.get("lora_alpha", settings["r"]))


def read_peft_adapter(
    folder: str | os.PathLike, config: ModelConfig
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A PEFT LoRA adapter as nnlib Dense path -> (a [in, r], b [r, out]).

    The scale (lora_alpha / r, or / sqrt(r) with use_rslora) is folded into b, so the adapted
    layer computes `x @ kernel + x @ a @ b`. Paths are per layer (`layers/3/attn/q_proj`).

    Raises SurgeryError naming the problem: not a LoRA adapter, settings that change
    what the tensors mean (DoRA, fan_in_fan_out, trained biases, modules_to_save), a module
    this model has no Linear for, or tensors whose shapes do not fit the layer.
    """
    folder = pathlib.Path(folder)
    config_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise SurgeryError(
            f"{folder}: not a PEFT adapter folder (needs adapter_config.json and "
            "adapter_model.safetensors, as peft's save_pretrained writes them)"
        )
    settings = json.loads(config_path.read_text())
    if settings.get("peft_type", "LORA") != "LORA":
        raise SurgeryError(
            f"{config_path}: peft_type {settings['peft_type']!r}; only LoRA adapters load"
        )
    for key, neutral in _NEUTRAL.items():
        if settings.get(key, neutral) != neutral:
            raise SurgeryError(
                f"{config_path}: {key}={settings[key]!r} is not supported (only {neutral!r})"
            )
    if settings.get("modules_to_save"):
        raise SurgeryError(
            f"{config_path}: modules_to_save={settings['modules_to_save']!r} carries full "
            "weights besides the adapter; merge the adapter instead"
        )
    modules = _dense_modules(config)
    halves: dict[str, dict[str, np.ndarray]] = {}
    with open_safetensors(weights_path) as tensors:
        for name in tensors.keys():  # noqa: SIM118 (safe_open has no __iter__)
            match = _PAIR.match(name)
            if match is None:
                raise SurgeryError(
                    f"{weights_path}: tensor {name!r} is not a LoRA pair "
                    "(base_model.model.<module>.lora_A/lora_B.weight)"
                )
            halves.setdefault(match["module"], {})[match["half"]] = tensors.get_tensor(name)
    adapters = {}
    for module, pair in sorted(halves.items()):
        if module not in modules:
            example = next(iter(modules), "model.layers.0.self_attn.q_proj")
            raise SurgeryError(
                f"{weights_path}: the adapter targets {module!r}, which is no Linear layer of "
                f"this model (its Linear layers are named like {example!r})"
            )
        if set(pair) != {"A", "B"}:
            raise SurgeryError(f"{weights_path}: {module!r} lacks its lora_A or lora_B")
        lora_a, lora_b = (np.asarray(pair[h], np.float32) for h in ("A", "B"))
        rank = lora_a.shape[0]
        if lora_a.ndim != 2 or lora_b.ndim != 2 or lora_b.shape[1] != rank:
            raise SurgeryError(
                f"{weights_path}: {module!r} has lora_A {lora_a.shape} and lora_B "
                f"{lora_b.shape}; expected [r, in] and [out, r]"
            )
        alpha = _alpha(settings, module)
        scale = alpha / (math.sqrt(rank) if settings.get("use_rslora") else rank)
        adapters[modules[module]] = (lora_a.T.copy(), (lora_b.T * scale).astype(np.float32))
    return adapters


def load_peft_adapter(model: nnx.Module, folder: str | os.PathLike) -> list[str]:
    """Attach a PEFT LoRA adapter to `model`'s Dense layers (nnlib LoRA modules whose a and b
    are the adapter's, the scale folded into b); returns the adapted paths.

    Raises SurgeryError as `read_peft_adapter` does, and for a layer whose sizes
    differ from the adapter's or a scan_layers model (its layers are one stacked Dense).
    """
    if model.config.scan_layers:
        raise SurgeryError(
            "load_peft_adapter: the model has scan_layers=True; PEFT adapters are per layer, "
            "build the model with scan_layers=False"
        )
    adapters = read_peft_adapter(folder, model.config)
    dense = {p: m for p, m in iter_modules(model) if isinstance(m, Dense)}
    for path, (a, b) in adapters.items():
        layer = dense[path]
        d_in, d_out = math.prod(layer.in_features), math.prod(layer.out_features)
        if a.shape[0] != d_in or b.shape[1] != d_out:
            raise SurgeryError(
                f"{folder}: the adapter of {path!r} is [{a.shape[0]} -> {b.shape[1]}], the "
                f"layer [{d_in} -> {d_out}]"
            )
        rank = a.shape[1]
        apply_lora(model, rf"^{re.escape(path)}$", rank=rank, alpha=rank)  # scale 1: in b
        layer.lora.a[...] = a.astype(layer.lora.a[...].dtype)
        layer.lora.b[...] = b.astype(layer.lora.b[...].dtype)
    return sorted(adapters)
