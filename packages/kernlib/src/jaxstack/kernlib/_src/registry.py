"""The op table: name -> api module (its `OP` and its public function), imported lazily."""

from __future__ import annotations

import importlib
from types import ModuleType

from jaxstack.kernlib._src.errors import ConfigError

OP_NAMES = (
    "attention",
    "ragged_paged_attention",
    "rms_norm",
    "grouped_matmul",
    "quantized_matmul",
)
"""The ops kernlib serves, one public function each (`kernlib.attention`, ...);
`implementations(op)` lists the backends of each."""


def api_module(op: str) -> ModuleType:
    if op not in OP_NAMES:
        raise ConfigError(f"unknown op {op!r}; choose one of {list(OP_NAMES)}")
    return importlib.import_module(f"jaxstack.kernlib.ops.{op}.api")


def implementations(op: str) -> list[str]:
    """Names of the implementations of `op` (whether or not they run on this device)."""
    return sorted(api_module(op).OP.implementations)


def which_implementation(op: str, *args, **kwargs) -> tuple[str, dict | None]:
    """What `op(*args, **kwargs)` would run here: (implementation name, config as a dict)."""
    impl, cfg = getattr(api_module(op), op).call(*args, **kwargs).select()
    return impl.name, None if cfg is None else cfg.to_dict()
