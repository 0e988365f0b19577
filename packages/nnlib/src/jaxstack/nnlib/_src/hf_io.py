"""Load HF safetensors checkpoints into nnlib models and save nnlib models in the HF layout.

Loading is streaming: the checkpoint is validated from headers alone (one error listing all
missing, unexpected and mis-shaped tensors before any data is read), then tensors are read one
at a time from memory maps and written into the model. A model built with `load_hf_checkpoint`
is created abstractly first (nnx.eval_shape), so no random weights are materialised either.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack.nnlib._src.config import ModelConfig
from jaxstack.nnlib._src.errors import CheckpointMismatchError, Error
from jaxstack.nnlib._src.hf_config import config_to_hf
from jaxstack.nnlib._src.hf_names import TensorMap, tensor_maps
from jaxstack.nnlib._src.paths import iter_variables
from jaxstack.nnlib._src.safetensors_io import open_safetensors, save_safetensors, umask_mode

_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^layers/(\d+)/(.*)$")


class _Checkpoint:
    """Tensor name -> file of a single-file or index.json-sharded checkpoint."""

    def __init__(self, path: str | os.PathLike):
        path = pathlib.Path(path)
        index = None
        if path.is_dir():
            index_path = path / "model.safetensors.index.json"
            if index_path.exists():
                index = index_path
            elif (path / "model.safetensors").exists():
                path = path / "model.safetensors"
            else:
                raise Error(
                    f"{path} holds neither model.safetensors nor model.safetensors.index.json"
                )
        elif path.name.endswith(".index.json"):
            index = path
        if index is not None:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = {
                f: open_safetensors(index.parent / f) for f in sorted(set(weight_map.values()))
            }
            self.where = {name: files[f] for name, f in weight_map.items()}
        else:
            f = open_safetensors(path)
            self.where = dict.fromkeys(f.keys(), f)
        self.source = str(path)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(f.get_slice(name).get_shape()) for name, f in self.where.items()}

    def get(self, name: str) -> np.ndarray:
        return self.where[name].get_tensor(name)


def check_checkpoint(
    maps: list[TensorMap], shapes: dict[str, tuple[int, ...]], *, tied: bool, source: str
):
    """Raise one CheckpointMismatchError naming every missing, unexpected, mis-shaped tensor."""
    expected = {n: s for m in maps for n, s in zip(m.hf_names, m.hf_shapes, strict=True)}
    ignorable = {n for n in shapes if _IGNORED.match(n) or (tied and n == "lm_head.weight")}
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected) - ignorable)
    mis_shaped = [
        (n, tuple(shapes[n]), tuple(s))
        for n, s in expected.items()
        if n in shapes and tuple(shapes[n]) != tuple(s)
    ]
    if missing or unexpected or mis_shaped:
        raise CheckpointMismatchError(missing, unexpected, mis_shaped, source=source)


def _target(path: str, stacked: set[str]) -> tuple[str, int | None]:
    """Per-layer path -> (model path, layer slot) when layers are stacked."""
    m = _LAYER.match(path)
    if m and f"layers/{m.group(2)}" in stacked:
        return f"layers/{m.group(2)}", int(m.group(1))
    return path, None


def load_hf_weights(model: nnx.Module, path: str | os.PathLike) -> nnx.Module:
    """Load an HF checkpoint (file, folder or index.json) into `model` in place; returns it.

    LoRA adapters on the model are left untouched (they are not part of HF checkpoints).
    """
    config: ModelConfig = model.config
    ckpt = _Checkpoint(path)
    maps = tensor_maps(config)
    check_checkpoint(maps, ckpt.shapes(), tied=config.tie_embeddings, source=ckpt.source)
    from jaxstack.nnlib._src.lora import WEIGHTS

    state = nnx.state(model, WEIGHTS)
    variables = dict(iter_variables(state))
    stacked = {p for p in variables if config.scan_layers and p.startswith("layers/")}
    buffers: dict[str, np.ndarray] = {}
    for m in maps:
        target, slot = _target(m.path, stacked)
        var = variables[target]
        array = m.to_nnlib([ckpt.get(n) for n in m.hf_names])
        if slot is None:
            var.set_value(jnp.asarray(array, var.dtype))
        else:
            if target not in buffers:
                buffers[target] = np.zeros(var.shape, np.dtype(var.dtype))
            buffers[target][slot] = array
    for target, buf in buffers.items():
        variables[target].set_value(jnp.asarray(buf))
    nnx.update(model, state)
    return model


def load_hf_checkpoint(
    path: str | os.PathLike,
    *,
    config: ModelConfig | None = None,
    attention_fn=None,
    **config_overrides: Any,
) -> nnx.Module:
    """Build a Transformer from an HF folder (config.json + safetensors) without random init.

    `config_overrides` (e.g. scan_layers=True, dtype="bfloat16") adjust the config read from
    config.json.
    """
    from jaxstack.nnlib._src.transformer import Transformer

    if config is None:
        config = ModelConfig.from_hf_config(path, **config_overrides)
    elif config_overrides:
        config = config.replace(**config_overrides)
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0), attention_fn=attention_fn))
    return load_hf_weights(model, path)


def _param_arrays(model: nnx.Module) -> dict[str, Any]:
    """Model path -> array, with any LoRA adapters merged into their base kernels."""
    from jaxstack.nnlib._src.lora import merged_kernels

    return merged_kernels(model)


def save_hf_checkpoint(
    model: nnx.Module,
    directory: str | os.PathLike,
    *,
    max_shard_bytes: int | None = None,
    special_token_ids: Mapping[str, int | list[int] | None] | None = None,
    generation_config: Mapping[str, Any] | None = None,
    files: Mapping[str, str | bytes] | None = None,
) -> pathlib.Path:
    """Write config.json and model.safetensors (or shards + index.json) in the HF layout.

    LoRA adapters are merged into the exported weights. The folder is written under a unique
    temporary name and renamed, so a crash never leaves a half checkpoint behind.

    Args:
      special_token_ids: `bos_token_id`, `eos_token_id`, `pad_token_id` (None entries are
        skipped) for config.json and generation_config.json, which transformers and vLLM read
        to stop generating and to pad.
      generation_config: the generation_config.json to write (e.g. the source model's, whose
        `eos_token_id` may list several stop tokens); `special_token_ids` fill in the ids it
        lacks. Written whenever either argument is given.
      files: more files of the folder, name -> text or bytes (tokenizer files, chat template),
        written inside the same atomic rename.
    """
    config: ModelConfig = model.config
    hf_config = config_to_hf(config)  # refuses configs HF cannot express before writing
    ids = {k: v for k, v in (special_token_ids or {}).items() if v is not None}
    hf_config.update(ids)
    directory = pathlib.Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        _write_tensors(model, tmp, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
        if ids or generation_config is not None:
            generation = {**ids, **(generation_config or {"_from_model_config": True})}
            (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
        for name, content in (files or {}).items():
            if pathlib.Path(name).name != name or name in ("config.json", "generation_config.json"):
                raise Error(f"files: {name!r} is not a plain file name of the folder's own")
            target = tmp / name
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        os.chmod(tmp, umask_mode(0o777))  # mkdtemp's folder is private
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _write_tensors(model: nnx.Module, folder: pathlib.Path, max_shard_bytes: int | None) -> None:
    """model.safetensors, or shards of at most `max_shard_bytes` and their index.json."""
    config: ModelConfig = model.config
    arrays = _param_arrays(model)
    stacked = {p for p in arrays if config.scan_layers and p.startswith("layers/")}
    itemsize = np.dtype(jnp.dtype(config.param_dtype)).itemsize
    shards: list[list[TensorMap]] = [[]]
    size = 0
    for m in tensor_maps(config):
        nbytes = sum(int(np.prod(s)) for s in m.hf_shapes) * itemsize
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(m)
        size += nbytes

    def tensors(group: list[TensorMap]) -> dict[str, np.ndarray]:
        out = {}
        for m in group:
            target, slot = _target(m.path, stacked)
            array = np.asarray(arrays[target] if slot is None else arrays[target][slot])
            out.update(zip(m.hf_names, m.to_hf(array), strict=True))
        return out

    if len(shards) == 1:
        save_safetensors(tensors(shards[0]), folder / "model.safetensors")
        return
    weight_map, total = {}, 0
    for i, group in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        shard = tensors(group)
        save_safetensors(shard, folder / name)
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(t.nbytes for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
