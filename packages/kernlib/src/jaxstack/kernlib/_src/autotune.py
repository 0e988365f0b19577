"""Autotuning: time every runnable (implementation, config) on this device, record the winner.

Candidates are timed in a fixed order (each implementation's defaults first) and the winner is
the lowest median with ties going to the earlier candidate, so the recorded choice is a pure
function of the measurements; `implementation=None` then reuses it verbatim for the same
(device kind, op, argument spec).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxstack.kernlib._src import device, dispatch, registry, tuning


def median_ms(fn, args, repeats: int, warmup: int = 2) -> float:
    """Median wall time of `fn(*args)` in milliseconds over `repeats` runs after `warmup` runs
    (each waited for with `jax.block_until_ready`)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def candidates(
    op: dispatch.Op,
    args: tuple[Any, ...],
    options: dict[str, Any],
    *,
    implementations: Sequence[str] | None = None,
    interpret: bool = False,
    max_configs: int | None = None,
    log: Callable[[str], None] = print,
) -> list[tuple[dispatch.Implementation, Any]]:
    plat = device.platform()
    out = []
    for name, impl in op.implementations.items():
        if implementations is not None and name not in implementations:
            continue
        if impl.platform not in (None, plat) and not interpret:
            continue
        reason = impl.check(*args, **options)
        if reason:
            log(f"  skip {name}: {reason}")
            continue
        configs = impl.config_cls.sweep() if impl.config_cls else [None]
        out += [(impl, cfg) for cfg in configs[:max_configs]]
    return out


def autotune(
    op_name: str,
    dims: dict[str, int],
    *,
    dtype: str = "bfloat16",
    implementations: Sequence[str] | None = None,
    interpret: bool = False,
    repeats: int = 5,
    warmup: int = 2,
    max_configs: int | None = None,
    cache: tuning.TuningCache | None = None,
    record: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Sweeps `op_name` on example inputs of `dims`; returns (and records) the winning entry."""
    op = registry.api_module(op_name).OP
    args, options = op.example(dims, dtype)
    spec = op.spec(*args, **options)
    kind = device.device_kind()
    log(f"autotune {op_name} on {kind}: {spec}")
    results = []
    for impl, cfg in candidates(
        op,
        args,
        options,
        implementations=implementations,
        interpret=interpret,
        max_configs=max_configs,
        log=log,
    ):
        fn = jax.jit(
            op.timed(functools.partial(impl.run, config=cfg, interpret=interpret, **options))
        )
        label = {"implementation": impl.name, "config": None if cfg is None else cfg.to_dict()}
        try:
            ms = median_ms(fn, args, repeats, warmup)
        except Exception as e:  # a config the device cannot compile is a loser, not a crash
            log(f"  {impl.name} {label['config']}: failed ({type(e).__name__}: {e})"[:300])
            continue
        log(f"  {impl.name} {label['config']}: {ms:.3f} ms")
        results.append({**label, "median_ms": round(ms, 4)})
    if not results:
        raise RuntimeError(f"no candidate of {op_name} ran on {kind}")
    best = min(range(len(results)), key=lambda i: (results[i]["median_ms"], i))
    entry = {
        **results[best],
        "candidates": len(results),
        "repeats": repeats,
        "jax_version": jax.__version__,
        "interpret": interpret,
    }
    if record:
        path = (cache or tuning.default_cache()).record(kind, op_name, spec, entry)
        log(f"recorded {entry['implementation']} {entry['config']} in {path}")
    return entry
