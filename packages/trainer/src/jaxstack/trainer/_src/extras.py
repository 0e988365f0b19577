"""Optional integrations: kernlib attention (the `kernels` extra) and xprof-lite step profiles.

The trainer runs without kernlib; asking for it when it is not installed is a `ConfigError`
that names the extra to install, raised before anything is built or compiled. xprof-lite is a
dependency (it also supplies the device peak and the host-allocator setting).
"""

from __future__ import annotations

import importlib
import pathlib
from types import ModuleType
from typing import Any

from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.errors import ConfigError

ATTENTION_CHOICES = ("xla", "kernlib")


def attention_function(name: str) -> Any:
    """The attention function handed to nnlib's Transformer (None: nnlib's XLA default)."""
    if name == "xla":
        return None
    if name == "kernlib":
        return _require("jaxstack.kernlib", "kernels", "train.attention='kernlib'").attention
    raise ConfigError(f"train.attention={name!r} is not one of {', '.join(ATTENTION_CHOICES)}")


def step_profiler(config: Config, run_dir: pathlib.Path) -> Any:
    """An xprof-lite profiler tracing steps log.profile_start.. (None when not asked for)."""
    if config.log.profile_start is None:
        return None
    from jaxstack import xprof_lite

    return xprof_lite.StepWindowProfiler(
        run_dir / "profile",
        start_step=config.log.profile_start,
        num_steps=config.log.profile_steps,
    )


def check(config: Config) -> None:
    """Fail early, before any compile, when a requested extra is missing."""
    attention_function(config.train.attention)


def _require(module: str, extra: str, setting: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"{setting} needs the {extra!r} extra, which is not installed: "
            f"pip install 'jaxstack-trainer[{extra}]'"
        ) from e
