"""Quantisation-aware training: `quant.rules=int8|w8a8|int4|nf4|RULES.yaml` (the `quant` extra).

The matched projections of the model are fake-quantised with a straight-through estimator
(jaxstack-quantlib's `QatProvider`) in every train and eval step, so the run learns weights
that survive quantisation. Checkpoints keep the float parameters; `jaxstack-quant ptq RUN
--rules <the same rules> --out DIR` stores them quantised, with the same outputs.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.errors import ConfigError


def _quantlib() -> ModuleType:
    try:
        from jaxstack import quantlib
    except ImportError as e:
        raise ConfigError(
            "quant.rules needs the 'quant' extra, which is not installed: "
            "pip install 'jaxstack-trainer[quant]'"
        ) from e
    return quantlib


def rules(config: Config) -> Any:
    """The run's QAT rules (None when `quant.rules` is unset); bad rules are a ConfigError."""
    if config.quant.rules is None:
        return None
    ql = _quantlib()
    try:
        return ql.load_rules(config.quant.rules)
    except ql.Error as e:
        raise ConfigError(f"quant.rules={config.quant.rules!r}: {e}") from e


def apply(config: Config, model: Any) -> Any:
    """`model` with QAT interception on its matched modules (itself when quant.rules is unset)."""
    qat_rules = rules(config)
    if qat_rules is None:
        return model
    ql = _quantlib()
    try:
        return ql.quantize(model, ql.QatProvider(qat_rules))
    except ql.Error as e:
        raise ConfigError(f"quant.rules={config.quant.rules!r}: {e}") from e
