"""Import Grain without letting it import JAX.

Grain imports JAX opportunistically (`tree_lib`, `profiler`: `try: import jax`), which costs
seconds and hundreds of MB in every process that merely builds an input pipeline, and breaks the
promise that datalib never imports JAX. While Grain's modules load, `sys.modules["jax"]` is set
to None so those imports fall back to Grain's pure-Python paths; the entry is removed afterwards,
so the user's own `import jax` works as usual. Nothing is blocked when JAX or Grain is already
loaded (then the choice was made elsewhere).

Every datalib module that builds pipelines takes `grain` from here (`from
jaxstack.datalib._src.nojax import grain`), so the first of them to load decides, and a missing
Grain (the `grain` extra) is one clear error. Tokenizers and chat templates need no Grain.

Worker processes are started with "spawn" and import Grain before any user code. `mark_children`
puts a marker into the multiprocessing config that every spawned child unpickles before its
target, and unpickling it imports this module first, so workers load Grain without JAX too.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import multiprocessing
import sys

# Every Grain module datalib reaches, including the ones Grain imports lazily later (the
# private ones only where this Grain version has them).
_GRAIN_MODULES = (
    "grain",
    "grain.experimental",
    "grain.sources",
)
_GRAIN_LAZY_MODULES = (
    "grain._src.python.dataset.transformations.prefetch",
    "grain._src.python.dataset.transformations.process_prefetch",
    "grain._src.python.dataset.transformations.packing",
    "grain._src.python.dataset.transformations.packing_concat_then_split",
    "grain._src.python.dataset.transformations.flatmap",
    "grain._src.python.dataset.transformations.mix",
    "grain._src.python.dataset.transformations.batch",
    "grain._src.python.dataset.transformations.interleave",
)


GRAIN_MISSING = (
    "datalib's input pipelines (lm_batches, pack, mixture, ...) need Grain: "
    "pip install 'jaxstack-datalib[grain]'"
)


def _import_all() -> None:
    try:
        importlib.import_module("grain")
    except ModuleNotFoundError as e:
        if e.name != "grain":
            raise
        raise ModuleNotFoundError(GRAIN_MISSING, name="grain") from None
    for name in _GRAIN_MODULES:
        importlib.import_module(name)
    for name in _GRAIN_LAZY_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # the module exists but something it imports does not
                raise


def import_grain_without_jax() -> None:
    if "jax" in sys.modules or "grain" in sys.modules:
        _import_all()
        return
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    # Grain warns that it could not load the JAX profiler, which is the point here.
    absl_logger.setLevel(logging.ERROR)
    sys.modules["jax"] = None  # type: ignore[assignment]
    try:
        _import_all()
    finally:
        if sys.modules.get("jax", 0) is None:
            del sys.modules["jax"]
        absl_logger.setLevel(level)


def _child_marker() -> None:
    """Runs in spawned children, after this module (and so Grain without JAX) was imported.

    Grain's worker leaves its iterators in reference cycles; collecting them at exit, while
    modules are intact, keeps their __del__ from printing tracebacks during teardown.
    """
    atexit.register(gc.collect)


class _ChildMarker:
    def __reduce__(self):
        return (_child_marker, ())


def mark_children() -> None:
    """Make processes spawned from now on import Grain without JAX (see module docstring)."""
    config = multiprocessing.current_process()._config
    config.setdefault("jaxstack_datalib_nojax", _ChildMarker())


import_grain_without_jax()
import grain as grain  # noqa: E402  (re-exported for datalib's modules; loaded just above)
