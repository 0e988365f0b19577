"""Argument specs: the canonical string that keys implementation choice and tuning results.

A spec names each array argument's dtype and shape and each static option, in a fixed order,
so the same call always produces the same key (and a tuned winner is reused deterministically).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def _array_spec(x: Any) -> str:
    if x is None:
        return "none"
    dims = ",".join(str(int(d)) for d in x.shape)
    return f"{np.dtype(x.dtype).name}[{dims}]"


def _option_spec(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def spec_key(arrays: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """`q=bfloat16[1,2048,16,128];...|causal=1;sliding_window=none` style key."""
    parts = [f"{name}={_array_spec(x)}" for name, x in arrays.items()]
    opts = [f"{name}={_option_spec(v)}" for name, v in sorted(options.items())]
    return ";".join(parts) + "|" + ";".join(opts)
