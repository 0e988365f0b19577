"""`quantize(model, provider)`: PTQ and QAT by rules, as Qwix's `quantize_model` does it.

    qmodel = quantize(model, PtqProvider([QuantRule(r"attn/.*_proj$", "int8", act_qtype="int8"),
                                          QuantRule(".*", "int4", tile_size=128)]))
    logits, _ = qmodel(tokens, positions)          # same call, quantised matmuls

The returned model is a copy; the call signature is unchanged. PTQ stores matched weights as
QuantizedTensors (in `QuantizedWeight` variables, so they are not trainable parameters); QAT
keeps them float and fake-quantises them on every call. `quantize(qat_model, PtqProvider(same
rules))` turns a QAT-trained model into its PTQ form with the same outputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack.quantlib._src import evaluate, intercept, qtypes, tensor
from jaxstack.quantlib._src.errors import RuleError
from jaxstack.quantlib._src.match import match_rules
from jaxstack.quantlib._src.rules import QuantRule


class PtqProvider:
    """Post-training quantisation: weights stored quantised, activations per rule."""

    mode = "ptq"

    def __init__(self, rules: Sequence[QuantRule]):
        self.rules = tuple(rules)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.rules)!r})"


class QatProvider(PtqProvider):
    """Quantisation-aware training: float weights, fake-quantised with a straight-through
    estimator on every call, so training sees (and adapts to) the quantisation error."""

    mode = "qat"

    def __init__(self, rules: Sequence[QuantRule]):
        super().__init__(rules)
        static = [r.module_path for r in self.rules if r.act_static]
        if static:
            raise RuleError(
                f"QatProvider quantises activations dynamically; act_static=True rules {static} "
                "are for PTQ (calibrate after converting with PtqProvider)"
            )


def quantize(
    model: nnx.Module,
    provider: PtqProvider,
    *,
    calibration: Iterable[Mapping[str, Any]] | None = None,
) -> nnx.Module:
    """A quantised copy of `model` with the same call signature.

    Args:
      model: a Flax NNX model (nnlib's Transformer or any module tree); a model returned by
        `quantize` with a QatProvider is converted (its fake-quantised weights become stored
        ones).
      provider: `PtqProvider(rules)` or `QatProvider(rules)`.
      calibration: batches (dicts with `tokens`, `positions`, `segment_ids`, e.g. from
        `datalib.lm_batches`; all of the iterable is used) for rules with `act_static=True`;
        the model is called as `model(tokens, positions, segment_ids)`.

    Raises:
      RuleError: unknown qtype, a tile size that does not divide a weight, act_static rules
        without calibration batches.
    """
    return _quantize(model, provider, calibration)


def quantized_structure(model: nnx.Module, provider: PtqProvider) -> nnx.Module:
    """`quantize` without calibrating: static activation scales are placeholders, to be
    filled from a checkpoint (loading a saved quantised model)."""
    return _quantize(model, provider, None, calibrate=False)


def _quantize(
    model: nnx.Module,
    provider: PtqProvider,
    calibration: Iterable[Mapping[str, Any]] | None,
    *,
    calibrate: bool = True,
) -> nnx.Module:
    model = nnx.clone(model)
    for _, module in list(nnx.iter_graph(model)):
        if isinstance(module, nnx.Module) and hasattr(type(module), "_quant_base"):
            intercept.release(module)
    matches = match_rules(model, provider.rules)
    for path, module, rule in matches:
        if isinstance(module.kernel, intercept.QuantizedWeight):
            raise RuleError(
                f"{path} is already stored quantised; quantise the float (or QAT) model instead"
            )
        if rule.weight_qtype is not None:
            _check_weight(module, path, rule)
        intercept.intercept(module, path, rule, provider.mode)
    static = [(p, m, r) for p, m, r in matches if r.act_static]
    if static and not calibrate:
        for _, module, _ in static:
            module.act_scale = intercept.ActScale(jnp.float32(1.0))
    elif static:
        if calibration is None:
            raise RuleError(
                f"rules with act_static=True (modules {[p for p, _, _ in static][:3]}...) need "
                "calibration batches: quantize(..., calibration=batches)"
            )
        _calibrate(model, static, calibration)
    if provider.mode == "ptq":
        for path, module, rule in matches:
            if rule.weight_qtype is not None:
                module.kernel = intercept.QuantizedWeight(
                    tensor.quantize_tensor(
                        module.kernel[...],
                        rule.weight_qtype,
                        contract_ndim=intercept.contract_ndim(module, path),
                        tile_size=rule.tile_size,
                        calibration_method=rule.weight_calibration,
                    )
                )
    return model


def _check_weight(module: nnx.Module, path: str, rule: QuantRule) -> None:
    """Stacked kernels, tiles that do not divide, odd sizes for 4-bit packing: fail here, at
    quantize time (a QAT model would otherwise fail inside its first train step)."""
    kernel = module.kernel[...]
    try:
        jax.eval_shape(
            lambda w: tensor.quantize_tensor(
                w,
                rule.weight_qtype,
                contract_ndim=intercept.contract_ndim(module, path),
                tile_size=rule.tile_size,
                calibration_method=rule.weight_calibration,
            ),
            jax.ShapeDtypeStruct(kernel.shape, kernel.dtype),
        )
    except RuleError as e:
        raise RuleError(f"{path}: {e}" if not str(e).startswith(path) else str(e)) from None


def _calibrate(
    model: nnx.Module,
    static: list[tuple[str, nnx.Module, QuantRule]],
    batches: Iterable[Mapping[str, Any]],
) -> None:
    """Sets each static module's `act_scale` from the mean of its per-batch bounds."""
    for path, module, rule in static:
        intercept.intercept(module, path, rule, "calibrate")
    fn, state = evaluate.forward(model)
    with intercept.recording() as bounds:
        n = 0
        for batch in batches:
            fn(state, batch["tokens"], batch["positions"], batch.get("segment_ids"))
            n += 1
        jax.effects_barrier()
    if n == 0:
        raise RuleError("calibration gave no batches; pass at least one batch")
    for path, module, rule in static:
        if path not in bounds:
            raise RuleError(f"module {path!r} was not called during calibration")
        q = qtypes.get_qtype(rule.act_qtype, "act_qtype", weights=False)
        bound = float(np.mean(bounds[path]))
        scale = bound / q.scale_bound if bound > 0 else 1.0
        module.act_scale = intercept.ActScale(jnp.float32(scale))
        intercept.intercept(module, path, rule, "ptq")


def weight_bytes(model: nnx.Module) -> dict[str, int]:
    """Bytes of the model's weights: `total`, and `quantized` (the matched, stored-quantised
    ones) with `quantized_float` (what those weighed in their original dtype)."""
    total = quantized = original = 0
    for _, var in nnx.iter_graph(model):
        if isinstance(var, intercept.QuantizedWeight):
            qt = var.get_value()
            quantized += qt.nbytes
            original += int(np.prod(qt.shape)) * jnp.dtype(qt.dtype).itemsize
            total += qt.nbytes
        elif isinstance(var, nnx.Variable) and not isinstance(var, intercept.ActScale):
            total += sum(x.nbytes for x in jax.tree.leaves(var.get_value()) if hasattr(x, "nbytes"))
    return {"total": total, "quantized": quantized, "quantized_float": original}
