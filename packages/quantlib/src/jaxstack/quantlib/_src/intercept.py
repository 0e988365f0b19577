"""Interception of matched modules' calls: nothing in the model's source changes.

Like Qwix, quantlib swaps the class of each matched module instance for a subclass with an
intercepting `__call__` (cached per class, same name, `isinstance` unchanged). Qwix swaps the
model's top-level class and patches `jax.lax.dot_general` & co. for the duration of the call;
quantlib intercepts at the matched module itself, so nothing global is patched, jit caches stay
valid, and other threads and unmatched modules see plain JAX. Inside the call:

- activations: the first positional input is quantised (per token, or with the module's static
  `act_scale`), straight-through so QAT gradients flow;
- weights (PTQ): the `kernel` holds a QuantizedTensor. nnlib's Dense multiplies it as it is
  (`x @ kernel.astype(dtype).reshape(K, N)` lands in `QuantizedTensor.__rmatmul__`, i.e.
  kernlib's quantized_matmul); any other module (Flax NNX Linear, Einsum) sees the dequantised
  weight for the length of its call;
- weights (QAT): the float `kernel` is replaced by its fake-quantised value for the call;
- calibration: the input's calibrated bound is sent to the host (`jax.debug.callback`) and
  nothing is quantised.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstack import nnlib
from jaxstack.quantlib._src import calibration, tensor
from jaxstack.quantlib._src.errors import RuleError

# Modules whose own matmul code takes a QuantizedTensor directly (see tensor.py).
OPERAND_MODULES: tuple[type, ...] = (nnlib.Dense,)


class QuantizedWeight(nnx.Variable):
    """A weight stored as a QuantizedTensor: not an nnx.Param, so it is never trained."""


class ActScale(nnx.Variable):
    """A module's static activation scale, calibrated on sample batches."""


_SUBCLASSES: dict[type, type] = {}
_recorded: dict[str, list[float]] | None = None


def base_class(module: nnx.Module) -> type:
    return getattr(type(module), "_quant_base", type(module))


def intercept(module: nnx.Module, path: str, rule: Any, mode: str) -> None:
    """Make `module` quantise per `rule` in `mode` ("ptq", "qat" or "calibrate")."""
    base = base_class(module)
    if base not in _SUBCLASSES:
        _SUBCLASSES[base] = type(base)(
            base.__name__,
            (base,),
            {"__call__": _quantized_call, "_quant_base": base, "__module__": base.__module__},
        )
    module.__class__ = _SUBCLASSES[base]
    module.quant_path, module.quant_rule, module.quant_mode = path, rule, mode


def release(module: nnx.Module) -> None:
    """Undo `intercept` (the module's variables are left as they are)."""
    module.__class__ = base_class(module)
    for name in ("quant_path", "quant_rule", "quant_mode"):
        vars(module).pop(name, None)


def contract_ndim(module: nnx.Module, path: str) -> int:
    """How many leading kernel axes the module's matmul contracts."""
    if not isinstance(module, nnlib.Dense):
        return 1
    n_in, n_out = len(module.in_features), len(module.out_features)
    if module.kernel[...].ndim != n_in + n_out:
        raise RuleError(
            f"{path}: kernel {module.kernel[...].shape} is stacked over layers (scan_layers); "
            "quantise a model built with scan_layers=False"
        )
    return n_in


@contextlib.contextmanager
def _weight_as(module: nnx.Module, value: jax.Array) -> Iterator[None]:
    var = module.kernel
    saved = var.get_value()
    var.set_value(value)
    try:
        yield
    finally:
        var.set_value(saved)


def _quantized_call(self, x: jax.Array, *args: Any, **kwargs: Any) -> Any:
    rule, mode = self.quant_rule, self.quant_mode
    call = functools.partial(type(self)._quant_base.__call__, self)
    if mode == "calibrate":
        if rule.act_static:
            bound = calibration.bound_fn(rule.act_calibration)(
                jnp.abs(x.astype(jnp.float32)).reshape(-1), axis=0, keepdims=False
            )
            jax.debug.callback(functools.partial(_record, self.quant_path), bound)
        return call(x, *args, **kwargs)
    if rule.act_qtype is not None:
        scale = self.act_scale[...] if rule.act_static else None
        x = tensor.fake_quantize_activation(x, rule.act_qtype, rule.act_calibration, scale)
    if rule.weight_qtype is None:
        return call(x, *args, **kwargs)
    if mode == "qat":
        w = tensor.fake_quantize(
            self.kernel[...],
            rule.weight_qtype,
            contract_ndim=contract_ndim(self, self.quant_path),
            tile_size=rule.tile_size,
            calibration_method=rule.weight_calibration,
        )
        with _weight_as(self, w):
            return call(x, *args, **kwargs)
    if isinstance(self, OPERAND_MODULES):
        return call(x, *args, **kwargs)
    with _weight_as(self, self.kernel[...].dequantize()):
        return call(x, *args, **kwargs)


def _record(path: str, bound: Any) -> None:
    if _recorded is not None:
        _recorded.setdefault(path, []).append(float(bound))


@contextlib.contextmanager
def recording() -> Iterator[dict[str, list[float]]]:
    """Collects the calibration bounds sent by modules in "calibrate" mode, per module path."""
    global _recorded
    _recorded = {}
    try:
        yield _recorded
    finally:
        _recorded = None
