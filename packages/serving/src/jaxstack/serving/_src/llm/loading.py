"""Find a model, its tokenizer and its chat template from one path.

Four layouts are recognised:
- an HF folder: config.json + model.safetensors (or shards), tokenizer.json and
  tokenizer_config.json (chat template, special tokens) beside them;
- a `jaxstack-train` run directory: config.yaml + checkpoints/ (the newest good step);
- a ckptlib checkpoint directory whose metadata holds {"config": {"model": ...}} (the
  trainer's form: an nnlib preset name plus overrides, or a full ModelConfig dict);
- a `jaxstack-quant ptq` output directory (quant.json + checkpoint/): the quantised model as
  stored, through jaxstack-quantlib (the `quant` extra).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxstack import ckptlib, datalib, nnlib
from jaxstack.serving._src.errors import ConfigError

QUANT_RECORD = "quant.json"  # written by jaxstack-quant ptq beside its checkpoint/
# The conversation format of models trained here without an HF folder (a jaxstack-train run,
# a ckptlib checkpoint, a jaxstack-quant output): ChatML, the layout jaxstack-rl's SFT writes
# when it is given no template. An HF folder never gets it: its model was trained on its own.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclasses.dataclass
class LoadedModel:
    model: nnx.Module
    tokenizer: Any
    chat_template: datalib.ChatTemplate | None
    name: str
    eos_token_ids: tuple[int, ...] = ()  # generation_config.json's end tokens, if any


def load_model(
    path: str | os.PathLike, *, chat_template: str | os.PathLike | None = None
) -> LoadedModel:
    """The model, tokenizer and chat template at `path`.

    Args:
      chat_template: a Jinja chat-template file that replaces the model's own.
    """
    loaded = _load(pathlib.Path(path))
    if chat_template is not None:
        loaded.chat_template = _template_file(pathlib.Path(chat_template), pathlib.Path(path))
    return loaded


def _load(path: pathlib.Path) -> LoadedModel:
    if not path.is_dir():
        raise ConfigError(
            f"--model {path}: no such directory; pass an HF folder, a run "
            "directory or a checkpoint directory"
        )
    if (path / "config.json").is_file():
        model = nnlib.load_hf_checkpoint(path)
        tokenizer, template = _tokenizer_file(path), _chat_template(path)
        return LoadedModel(model, tokenizer, template, path.name, _end_tokens(path))
    if (path / QUANT_RECORD).is_file():
        return _load_quantized(path)
    ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not ckptlib.list_checkpoints(ckpt_dir):
        raise ConfigError(
            f"{path} holds neither an HF model (config.json) nor checkpoints; pass an HF "
            "folder, a jaxstack-train run directory or a ckptlib checkpoint directory"
        )
    with ckptlib.CheckpointManager(ckpt_dir, read_only=True) as manager:
        restored = manager.restore(subtree="params")
    config = (restored.metadata or {}).get("config") or {}
    if "model" not in config:
        raise ConfigError(
            f"{ckpt_dir}: the checkpoint metadata has no config.model; save it with "
            "metadata={'config': {'model': model_config.to_dict()}}"
        )
    arrays = _flat_params(restored.state)
    model_config = _model_config(config, arrays)
    model = nnx.eval_shape(lambda: nnlib.Transformer(model_config, rngs=nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    missing = []

    def take(key_path, leaf):
        name = nnlib.param_path(key_path)
        if name not in arrays or arrays[name].shape != leaf.shape:
            missing.append(name)
            return leaf
        return jax.numpy.asarray(arrays[name], leaf.dtype)

    params = jax.tree_util.tree_map_with_path(take, params)
    if missing:
        raise ConfigError(
            f"{ckpt_dir}: parameters missing or mis-shaped for the saved config: {missing[:5]}"
        )
    nnx.update(model, params)
    tokenizer = _tokenizer_file(path) or _run_tokenizer(config)
    return LoadedModel(model, tokenizer, _chat_template(path, jaxstack_made=True), path.name)


def _load_quantized(path: pathlib.Path) -> LoadedModel:
    try:
        from jaxstack import quantlib
    except ImportError as e:
        raise ConfigError(
            f"{path} is a quantised model (quant.json); serving it needs jaxstack-quantlib: "
            "pip install 'jaxstack-serving[quant]'"
        ) from e
    model, record = quantlib.load_quantized(path)
    tokenizer = _tokenizer_file(path) or _run_tokenizer({"data": record})  # quant.json: tokenizer
    return LoadedModel(model, tokenizer, _chat_template(path, jaxstack_made=True), path.name)


def _flat_params(tree: Any) -> dict[str, np.ndarray]:
    """Restored params by path. Without a target, ckptlib rebuilds an nnx State as plain dicts
    in which each Variable is a {"value": array} dict; that wrapper is not a parameter name."""
    flat = {}
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = nnlib.param_path(key_path)
        flat[name.removesuffix("/value")] = np.asarray(leaf)
    return flat


def _model_config(config: dict[str, Any], arrays: dict[str, np.ndarray]) -> nnlib.ModelConfig:
    fields = dict(config["model"])
    preset = fields.pop("preset", None)
    base = nnlib.get_preset(preset) if preset else nnlib.ModelConfig()
    if "embed" in arrays:  # the trainer sizes the vocabulary from its tokenizer
        fields["vocab_size"] = arrays["embed"].shape[0]
    seq_len = (config.get("data") or {}).get("seq_len")
    if seq_len and fields.get("max_seq_len", base.max_seq_len) < seq_len:
        fields["max_seq_len"] = seq_len
    try:
        return nnlib.ModelConfig.from_dict({**base.to_dict(), **fields})
    except Exception as e:
        raise ConfigError(f"checkpoint config.model {config['model']!r} is not valid: {e}") from e


def _tokenizer_file(path: pathlib.Path):
    if (path / "tokenizer.json").is_file():
        return datalib.BPETokenizer.from_file(path / "tokenizer.json")
    return None


def _run_tokenizer(config: dict[str, Any]):
    name = (config.get("data") or {}).get("tokenizer", "byte")
    if name == "byte":
        return datalib.ByteTokenizer()
    return datalib.BPETokenizer.from_file(name)


def _chat_template(path: pathlib.Path, *, jaxstack_made: bool = False):
    """The folder's chat template as transformers finds it; for a model made by jaxstack
    without one, ChatML (DEFAULT_CHAT_TEMPLATE); otherwise None (chat requests get 400)."""
    try:
        template = datalib.ChatTemplate.from_model_folder(path)
    except datalib.Error as e:
        raise ConfigError(f"{e}; fix the file or pass --chat-template FILE") from None
    if template is None and jaxstack_made:
        return datalib.ChatTemplate(DEFAULT_CHAT_TEMPLATE)
    return template


def _end_tokens(path: pathlib.Path) -> tuple[int, ...]:
    """generation_config.json's `eos_token_id` (one id or a list: a chat model lists its
    end-of-turn there), which transformers' generate and vLLM stop on."""
    file = path / "generation_config.json"
    if not file.is_file():
        return ()
    try:
        ids = json.loads(file.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        raise ConfigError(f"{file}: not a generation config ({e}); fix or remove it") from None
    ids = [ids] if isinstance(ids, int) else ids or []
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ConfigError(f"{file}: eos_token_id must be a token id or a list of them")
    return tuple(ids)


def _template_file(path: pathlib.Path, model: pathlib.Path) -> datalib.ChatTemplate:
    """The template in `path`, with the special tokens (bos_token, ...) of the model folder's
    tokenizer_config.json, as vLLM's --chat-template keeps the tokenizer's."""
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--chat-template {path}: cannot read it ({e})") from None
    config: dict[str, Any] = {}
    config_file = model / "tokenizer_config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{config_file}: cannot read it ({e})") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{config_file}: is not a JSON object")
    try:
        return datalib.ChatTemplate.from_tokenizer_config({**config, "chat_template": source})
    except datalib.Error as e:
        raise ConfigError(f"--chat-template {path}: {e}") from None
