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

from jaxstack.quantlib._src.errors import Error, QuantWarning, RuleError, SourceError
from jaxstack.quantlib._src.evaluate import perplexity, validation_batches
from jaxstack.quantlib._src.intercept import ActScale, QuantizedWeight
from jaxstack.quantlib._src.matmul import quantized_matmul
from jaxstack.quantlib._src.qtypes import QTYPES
from jaxstack.quantlib._src.quantize import PtqProvider, QatProvider, quantize, weight_bytes
from jaxstack.quantlib._src.rules import PRESETS, QuantRule, load_rules, match_rules
from jaxstack.quantlib._src.source import Source, load_run
from jaxstack.quantlib._src.store import export_safetensors, load_quantized, save_quantized
from jaxstack.quantlib._src.tensor import (
    QuantizedTensor,
    fake_quantize,
    fake_quantize_activation,
    quantize_tensor,
)

__all__ = [
    "PRESETS",
    "QTYPES",
    "ActScale",
    "Error",
    "PtqProvider",
    "QatProvider",
    "QuantRule",
    "QuantWarning",
    "QuantizedTensor",
    "QuantizedWeight",
    "RuleError",
    "Source",
    "SourceError",
    "export_safetensors",
    "fake_quantize",
    "fake_quantize_activation",
    "load_quantized",
    "load_rules",
    "load_run",
    "match_rules",
    "perplexity",
    "quantize",
    "quantize_tensor",
    "quantized_matmul",
    "save_quantized",
    "validation_batches",
    "weight_bytes",
]
