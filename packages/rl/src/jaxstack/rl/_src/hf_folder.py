"""The Hugging Face folders of a run: the tokenizer it reads, the model folder it writes.

A run started from `init.hf=<folder>` takes that folder's tokenizer and chat template unless
`data.tokenizer` / `sft.chat_template` say otherwise, and refuses at start a tokenizer whose
vocabulary does not fit the model's embedding. What it writes, `run_dir/model`, is a complete
HF folder: config.json with the bos/eos/pad ids, generation_config.json, safetensors, the
tokenizer files and the chat template the run used. A LoRA run also writes `run_dir/adapter`,
the adapters in PEFT's layout (adapter_config.json + adapter_model.safetensors, tensors named
`base_model.model.<module>.lora_A.weight` [r, in] and `lora_B.weight` [out, r]).

The byte tokenizer has no files of its own, so the folder gets an equivalent tokenizer.json:
byte-level BPE without merges, ids 0 = <pad>, 1 = <s>, 2 = </s> and byte b -> b + 3.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Any

import numpy as np

from jaxstack.rl._src.errors import ConfigError

# The files a tokenizer's HF folder may hold; those present are copied into run_dir/model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
# An HF embedding may have more rows than the tokenizer has tokens (padded to a multiple of
# 64 or 128: Qwen2.5 has 271 spare rows); many more means the tokenizer is not the model's.
SPARE_ROWS = 1024


@dataclasses.dataclass
class TokenizerAssets:
    """A run's tokenizer, chat template, and the files an exported folder needs for them."""

    tokenizer: Any  # a datalib Tokenizer
    template: Any  # a datalib ChatTemplate
    files: dict[str, str | bytes]  # name -> content, for run_dir/model and run_dir/adapter
    generation_config: dict[str, Any] | None  # the source folder's, if it has one

    def special_token_ids(self) -> dict[str, int | None]:
        t = self.tokenizer
        return {"bos_token_id": t.bos_id, "eos_token_id": t.eos_id, "pad_token_id": t.pad_id}


def tokenizer_source(name: str) -> pathlib.Path | None:
    """The file or folder `data.tokenizer` names (None for "byte"), checked to exist."""
    if name == "byte":
        return None
    path = pathlib.Path(name)
    if path.is_dir() and not (path / "tokenizer.json").is_file():
        raise ConfigError(
            f"data.tokenizer={name!r} (init.hf's folder unless set) has no tokenizer.json; set "
            "data.tokenizer to the model's tokenizer.json or its folder, or 'byte' for a "
            "byte-level model"
        )
    if not path.exists():
        raise ConfigError(
            f"data.tokenizer={name!r}: no such tokenizer file or folder; use 'byte', a "
            "tokenizer.json, or an HF model folder"
        )
    return path


def load_tokenizer_assets(name: str, chat_template: str | None) -> TokenizerAssets:
    """The tokenizer `data.tokenizer` names, its chat template (`sft.chat_template` if given,
    else the tokenizer folder's, else the built-in plain one) and its files."""
    from jaxstack import datalib

    source = tokenizer_source(name)
    if source is None:
        tokenizer: Any = datalib.ByteTokenizer()
        files: dict[str, str | bytes] = {"tokenizer.json": byte_tokenizer_json()}
        folder = None
    else:
        try:
            tokenizer = datalib.BPETokenizer.from_file(source)
        except datalib.Error as e:
            raise ConfigError(f"data.tokenizer={name!r}: {e}") from None
        folder = source if source.is_dir() else source.parent
        files = {f: (folder / f).read_bytes() for f in TOKENIZER_FILES if (folder / f).is_file()}
        main = folder / "tokenizer.json" if source.is_dir() else source
        files["tokenizer.json"] = main.read_bytes()
    config = _json(files.get("tokenizer_config.json"), "tokenizer_config.json", folder)
    template = _chat_template(chat_template, folder, config)
    config.update(_token_entries(tokenizer), chat_template=template.source)
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    config.setdefault("clean_up_tokenization_spaces", False)
    files["tokenizer_config.json"] = json.dumps(config, indent=2, ensure_ascii=False)
    if "chat_template.jinja" in files:  # newer transformers read it before tokenizer_config's
        files["chat_template.jinja"] = template.source
    files.pop("chat_template.json", None)  # the processor form; tokenizer_config's is the one
    generation = None
    if folder is not None and (folder / "generation_config.json").is_file():
        generation = _json(
            (folder / "generation_config.json").read_bytes(), "generation_config.json", folder
        )
    return TokenizerAssets(tokenizer, template, files, generation)


def _json(raw: bytes | str | None, name: str, folder: pathlib.Path | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{folder}/{name} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{folder}/{name} must hold a JSON object")
    return value


def _token_entries(tokenizer: Any) -> dict[str, str]:
    """tokenizer_config.json's bos/eos/pad token strings, as the run's tokenizer has them."""
    backend = getattr(tokenizer, "backend", None)
    names = {
        "bos_token": tokenizer.bos_id,
        "eos_token": tokenizer.eos_id,
        "pad_token": tokenizer.pad_id,
    }
    if backend is None:  # the byte tokenizer's tokenizer.json
        return {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    return {k: backend.id_to_token(i) for k, i in names.items() if i is not None}


def _chat_template(
    explicit: str | None, folder: pathlib.Path | None, config: dict[str, Any]
) -> Any:
    """`sft.chat_template` if given, else the folder's (where transformers finds it), else the
    built-in one with the folder's special tokens."""
    from jaxstack import datalib
    from jaxstack.rl._src.encode import DEFAULT_CHAT_TEMPLATE

    try:
        if explicit is not None:
            return datalib.ChatTemplate.from_tokenizer_config(explicit)
        if folder is not None and (found := datalib.ChatTemplate.from_model_folder(folder)):
            return found
    except datalib.Error as e:
        where = explicit if explicit is not None else folder
        raise ConfigError(f"chat template of {where}: {e}") from None
    return datalib.ChatTemplate.from_tokenizer_config(
        {**config, "chat_template": DEFAULT_CHAT_TEMPLATE}
    )


def check_vocabulary(tokenizer: Any, model_vocab: int, *, where: str, pretrained: bool) -> None:
    """Refuses a tokenizer whose ids do not fit the model's embedding of `model_vocab` rows;
    for `pretrained` weights also one far smaller than the embedding (not the model's own)."""
    size = tokenizer.vocab_size
    ids = {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id}
    if size > model_vocab or any(i is not None and i >= model_vocab for i in ids.values()):
        raise ConfigError(
            f"the tokenizer has {size} tokens but {where} has an embedding of {model_vocab} rows: "
            "its ids would index past the embedding; use the model's own tokenizer (leave "
            "data.tokenizer unset with init.hf) or a model with a vocabulary this large"
        )
    if pretrained and model_vocab > size + SPARE_ROWS:
        raise ConfigError(
            f"the tokenizer has {size} tokens but {where} has an embedding of {model_vocab} rows: "
            "this is not the model's tokenizer, so its ids mean nothing to the model; use the "
            "model's own tokenizer (leave data.tokenizer unset with init.hf, or point it at the "
            "folder's tokenizer.json)"
        )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what ByteLevel pre-tokenizes to)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer_json() -> str:
    """A tokenizer.json whose ids are datalib.ByteTokenizer's (for transformers, vLLM)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    from jaxstack import datalib

    offset = datalib.ByteTokenizer.OFFSET
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({c: b + offset for b, c in _bytes_to_unicode().items()})
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    return tok.to_str()


# nnlib module path -> HF module name, for the Dense layers LoRA adapts.
_HF_MODULES = (
    (re.compile(r"^layers/(\d+)/attn/(q|k|v|o)_proj$"), r"model.layers.\1.self_attn.\2_proj"),
    (re.compile(r"^layers/(\d+)/mlp/(gate|up|down)_proj$"), r"model.layers.\1.mlp.\2_proj"),
    (re.compile(r"^lm_head$"), "lm_head"),
)
_STACKED = re.compile(r"^layers/(attn|mlp)/(\w+_proj)$")


def peft_tensors(model: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """PEFT's tensors (name -> array) and adapter settings of the model's LoRA adapters.

    Raises ConfigError naming an adapted layer PEFT has no name for (e.g. MoE experts).
    """
    from jaxstack import nnlib

    tensors: dict[str, np.ndarray] = {}
    ranks, alphas, dropouts = set(), set(), set()
    for path, module in nnlib.iter_modules(model):
        if not isinstance(module, nnlib.Dense) or module.lora is None:
            continue
        lora = module.lora
        a, b = np.asarray(lora.a[...], np.float32), np.asarray(lora.b[...], np.float32)
        stacked = _STACKED.match(path)
        if stacked:  # scan_layers: one Dense holds every layer's adapter on a leading axis
            names = [f"layers/{i}/{stacked.group(1)}/{stacked.group(2)}" for i in range(len(a))]
            pairs = list(zip(names, a, b, strict=True))
        else:
            pairs = [(path, a, b)]
        for nnlib_path, a_i, b_i in pairs:
            hf = _hf_module(nnlib_path)
            tensors[f"base_model.model.{hf}.lora_A.weight"] = np.ascontiguousarray(a_i.T)
            tensors[f"base_model.model.{hf}.lora_B.weight"] = np.ascontiguousarray(b_i.T)
        ranks.add(lora.rank)
        alphas.add(lora.alpha)
        dropouts.add(lora.rate)
    if not tensors:
        raise ConfigError("the model has no LoRA adapters to export")
    modules = sorted({n.removeprefix("base_model.model.").rsplit(".", 2)[0] for n in tensors})
    leaves = sorted({m.rsplit(".", 1)[-1] for m in modules})
    layers = {m.rsplit(".", 1)[0] for m in modules if m != "lm_head"}
    # Short names when every layer has the same adapters (PEFT's usual form), else full names.
    every_layer = all(f"{layer}.{leaf}" in modules for layer in layers for leaf in leaves)
    settings = {
        "r": int(ranks.pop()) if len(ranks) == 1 else None,
        "lora_alpha": float(alphas.pop()) if len(alphas) == 1 else None,
        "lora_dropout": float(dropouts.pop()) if len(dropouts) == 1 else 0.0,
        "target_modules": leaves if every_layer else modules,
    }
    return tensors, settings


def _hf_module(path: str) -> str:
    for pattern, name in _HF_MODULES:
        if pattern.match(path):
            return pattern.sub(name, path)
    raise ConfigError(
        f"LoRA on {path!r} has no PEFT module name (PEFT export covers the attention and MLP "
        "projections and lm_head); narrow lora.pattern to those to get run_dir/adapter"
    )


def adapter_config(settings: dict[str, Any], base_model: str | None) -> dict[str, Any]:
    """PEFT's adapter_config.json for a causal-LM LoRA adapter."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": settings["r"],
        "lora_alpha": settings["lora_alpha"],
        "lora_dropout": settings["lora_dropout"],
        "target_modules": settings["target_modules"],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "revision": None,
    }


def write_adapter_folder(
    model: Any, directory: pathlib.Path, *, base_model: str | None, files: dict[str, Any]
) -> pathlib.Path:
    """`directory` as a PEFT adapter folder (plus the tokenizer files), written atomically."""
    from safetensors.numpy import save

    tensors, settings = peft_tensors(model)
    contents = {
        **files,
        "adapter_config.json": json.dumps(adapter_config(settings, base_model), indent=2),
        "adapter_model.safetensors": save(tensors, metadata={"format": "pt"}),
    }
    write_folder(directory, contents)
    return directory


def write_folder(directory: pathlib.Path, contents: dict[str, str | bytes]) -> None:
    """Replaces `directory` by a folder of these files, built beside it and renamed in."""
    import os
    import shutil
    import tempfile

    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        dir=directory.parent, prefix=f".{directory.name}.tmp-", ignore_cleanup_errors=True
    ) as tmp:
        for name, content in contents.items():
            data = content if isinstance(content, bytes) else content.encode("utf-8")
            pathlib.Path(tmp, name).write_bytes(data)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
