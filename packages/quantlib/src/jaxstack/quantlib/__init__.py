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

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.quantlib, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.errors": ["Error", "QuantWarning", "RuleError", "SourceError"],
        "_src.evaluate": ["perplexity", "validation_batches"],
        "_src.intercept": ["ActScale", "QuantizedWeight"],
        "_src.match": ["match_rules"],
        "_src.matmul": ["quantized_matmul"],
        "_src.qtypes": ["QTYPES"],
        "_src.quantize": ["PtqProvider", "QatProvider", "quantize", "weight_bytes"],
        "_src.rules": ["PRESETS", "QuantRule", "load_rules"],
        "_src.source": ["Source", "load_run"],
        "_src.store": ["export_safetensors", "load_quantized", "save_quantized"],
        "_src.tensor": [
            "QuantizedTensor",
            "fake_quantize",
            "fake_quantize_activation",
            "quantize_tensor",
        ],
    },
)
