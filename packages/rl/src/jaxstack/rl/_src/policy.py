"""The model being post-trained: tokenizer, nnlib Transformer, starting weights, LoRA.

`Policy` holds the module and its pure `apply(params, ...)` over the *trainable* parameters
(every weight for full fine-tuning, only the `nnx.LoRAParam` adapters with `lora.rank > 0`).
`served_params(params)` gives the plain weights an inference engine serves: the adapters folded
into their kernels, in the structure of a model without adapters.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from flax import nnx

from jaxstack.rl._src.config import HF_COMPUTE_FIELDS, RLConfig
from jaxstack.rl._src.errors import ConfigError


def model_config(config: RLConfig, vocab_size: int) -> Any:
    """nnlib ModelConfig from `model.preset` and the other `model.*` fields; the vocabulary
    follows the tokenizer unless `model.vocab_size` is given."""
    from jaxstack import nnlib

    fields = dict(config.base.model)
    preset = fields.pop("preset", "tiny")
    if preset not in nnlib.list_presets():
        raise ConfigError(
            f"model.preset={preset!r} is not an nnlib preset; use one of "
            f"{', '.join(nnlib.list_presets())}"
        )
    fields.setdefault("vocab_size", vocab_size)
    base = nnlib.get_preset(preset)
    fields.setdefault("max_seq_len", max(base.max_seq_len, config.base.data.seq_len))
    try:
        return base.replace(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model section is not valid for nnlib: {e}") from None


def load_base_model(config: RLConfig, vocab_size: int) -> nnx.Module:
    """The Transformer with the `init` weights (or a fresh one seeded by train.seed); an
    `init.hf` model takes the config's `HF_COMPUTE_FIELDS`."""
    from jaxstack import nnlib

    if config.init.hf:
        compute = {k: v for k, v in config.model.items() if k in HF_COMPUTE_FIELDS}
        return nnlib.load_hf_checkpoint(config.init.hf, **compute)
    model = nnlib.Transformer(
        model_config(config, vocab_size), rngs=nnx.Rngs(config.base.train.seed)
    )
    if config.init.checkpoint:
        params = restore_params(config.init.checkpoint, nnx.state(model, nnx.Param))
        nnx.update(model, params)
    return model


def restore_params(run_or_checkpoints: str, like: Any) -> Any:
    """The newest checkpoint's `params` under a run directory (or its checkpoints folder)."""
    from jaxstack import ckptlib

    path = pathlib.Path(run_or_checkpoints)
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    if not path.is_dir():
        raise ConfigError(f"init.checkpoint={str(path)!r} is not a run or checkpoints directory")
    with ckptlib.CheckpointManager(path, read_only=True) as manager:
        return manager.restore(target=like, subtree="params").state


@dataclasses.dataclass
class Policy:
    """The module, its trainable parameters and the pure function over them."""

    model: nnx.Module
    tokenizer: Any
    apply: Any
    params: Any
    lora: bool
    quantized: bool = False
    assets: Any = None  # hf_folder.TokenizerAssets: template and files for exported folders

    def encoder(self) -> Any:
        """The records-to-tokens encoder every stage uses (this tokenizer, this template)."""
        from jaxstack.rl._src.encode import Encoder

        return Encoder(self.tokenizer, self.assets.template)

    def apply_with(self, attention_fn: Any) -> Any:
        """`apply` (over the same params) of the module with another attention function."""
        from jaxstack import nnlib

        model = nnx.clone(self.model)  # the arrays are shared, not copied
        model.attention_fn = attention_fn
        return nnlib.as_function(model, wrt=nnx.LoRAParam if self.lora else nnx.Param)[0]

    def served_params(self, params: Any) -> Any:
        """Weights for an engine serving the model without adapters (LoRA merged in)."""
        if not self.lora:
            return params
        from jaxstack import nnlib

        model = nnx.clone(self.model)
        nnx.update(model, params)
        nnlib.merge_lora(model)
        return nnx.state(model, nnx.Param)

    def base_model(self) -> nnx.Module:
        """A copy of the module without adapters, for an engine to own."""
        if not self.lora:
            return nnx.clone(self.model)
        from jaxstack import nnlib

        model = nnx.clone(self.model)
        nnlib.merge_lora(model)
        return model


def quantized_base(model: nnx.Module, qtype: str, tile: int) -> nnx.Module:
    """QLoRA's frozen base: every projection but the output head stored as `qtype`."""
    try:
        from jaxstack import quantlib
    except ImportError:
        raise ConfigError(
            "lora.quantize (QLoRA) needs jaxstack-quantlib: pip install 'jaxstack-rl[qlora]'"
        ) from None
    rules = [
        quantlib.QuantRule(r"lm_head", weight_qtype=None),
        quantlib.QuantRule(r".*", weight_qtype=qtype, tile_size=tile),
    ]
    try:
        return quantlib.quantize(model, quantlib.PtqProvider(rules))
    except quantlib.Error as e:
        raise ConfigError(f"lora.quantize={qtype!r}: {e}") from None


def build_policy(config: RLConfig) -> Policy:
    """Tokenizer, model with the `init` weights, LoRA adapters when `lora.rank > 0`."""
    from jaxstack import nnlib
    from jaxstack.rl._src.hf_folder import check_vocabulary, load_tokenizer_assets

    assets = load_tokenizer_assets(config.base.data.tokenizer, config.sft.chat_template)
    tokenizer = assets.tokenizer
    model = load_base_model(config, tokenizer.vocab_size)
    where = f"init.hf={config.init.hf!r}" if config.init.hf else "the model"
    check_vocabulary(
        tokenizer, model.config.vocab_size, where=where, pretrained=bool(config.init.hf)
    )
    lora = config.lora.rank > 0
    if config.lora.quantize is not None:
        model = quantized_base(model, config.lora.quantize, config.lora.quantize_tile)
    if lora:
        adapted = nnlib.apply_lora(
            model,
            config.lora.pattern,
            rank=config.lora.rank,
            alpha=config.lora.alpha,
            dropout=config.lora.dropout,
            rngs=nnx.Rngs(config.base.train.seed + 1),
        )
        if not adapted:
            raise ConfigError(f"lora.pattern={config.lora.pattern!r} matches no Dense layer")
    apply, params = nnlib.as_function(model, wrt=nnx.LoRAParam if lora else nnx.Param)
    return Policy(model, tokenizer, apply, params, lora, config.lora.quantize is not None, assets)
