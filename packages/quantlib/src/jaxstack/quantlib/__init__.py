"""Non-intrusive quantisation of Flax NNX models by rules on module paths: PTQ, QAT, QLoRA.

    from jaxstack import quantlib as ql

    rules = [ql.QuantRule(r"lm_head", weight_qtype=None),          # keep the head float
             ql.QuantRule(r".*", weight_qtype="int4", tile_size=128)]
    qmodel = ql.quantize(model, ql.PtqProvider(rules))             # same call signature
    logits, _ = qmodel(tokens, positions)

QAT: `ql.quantize(model, ql.QatProvider(rules))`, train it, then `ql.quantize(qat_model,
ql.PtqProvider(rules))`. QLoRA: PTQ with `nf4`/`int4`, then `nnlib.apply_lora` and train only
the adapters. See docs/quantlib.md.
"""

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.quantlib, or a command's --help, does not import JAX.
_EXPORTS = {
    "Error": "errors",
    "QuantWarning": "errors",
    "RuleError": "errors",
    "SourceError": "errors",
    "perplexity": "evaluate",
    "validation_batches": "evaluate",
    "ActScale": "intercept",
    "QuantizedWeight": "intercept",
    "match_rules": "match",
    "quantized_matmul": "matmul",
    "QTYPES": "qtypes",
    "PtqProvider": "quantize",
    "QatProvider": "quantize",
    "quantize": "quantize",
    "weight_bytes": "quantize",
    "PRESETS": "rules",
    "QuantRule": "rules",
    "load_rules": "rules",
    "Source": "source",
    "load_run": "source",
    "export_safetensors": "store",
    "load_quantized": "store",
    "save_quantized": "store",
    "QuantizedTensor": "tensor",
    "fake_quantize": "tensor",
    "fake_quantize_activation": "tensor",
    "quantize_tensor": "tensor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}._src.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
