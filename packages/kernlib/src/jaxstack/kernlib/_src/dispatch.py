"""Choosing an implementation: explicit request, tuned winner, or the platform's preference.

`implementation=None` consults the tuning cache for (device kind, op, spec), then the platform's
preference list, skipping implementations that cannot run the call (each skip is logged once,
with the reason) and ending at `xla`, which runs everywhere. On CPU the list is an op's XLA FFI
custom call (`ffi_cpu`, where the op has one), then `xla`: Pallas interpret mode is for
correctness tests, never for speed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from jaxstack.kernlib._src import device, tuning
from jaxstack.kernlib._src.config import KernelConfig
from jaxstack.kernlib._src.errors import ConfigError, UnsupportedError

logger = logging.getLogger("jaxstack.kernlib")

XLA = "xla"
PALLAS_TRITON = "pallas_triton"
PALLAS_MOSAIC_TPU = "pallas_mosaic_tpu"
FFI_CPU = "ffi_cpu"

PREFERENCE: dict[str, tuple[str, ...]] = {
    "gpu": (PALLAS_TRITON, XLA),
    "tpu": (PALLAS_MOSAIC_TPU, XLA),
    "cpu": (FFI_CPU, XLA),
}


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way to compute an op.

    `run(*arrays, config=, interpret=, **options)` computes it; `check(*arrays, **options)`
    returns why this implementation cannot run the call, or None. `platform` is where it
    compiles (None: everywhere); Pallas kernels (`interpretable`) also run elsewhere with
    `interpret=True`.
    """

    name: str
    run: Callable[..., Any]
    platform: str | None = None
    config_cls: type[KernelConfig] | None = None
    check: Callable[..., str | None] = lambda *a, **k: None
    interpretable: bool = True


@dataclasses.dataclass(frozen=True)
class Op:
    """An op: its implementations plus what autotuning needs (example inputs, what to time)."""

    name: str
    implementations: Mapping[str, Implementation]
    spec: Callable[..., str]  # (*arrays, **options) -> spec key
    example: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]  # (dims, dtype) -> args
    timed: Callable[..., Callable[..., Any]]  # (impl_fn) -> function of the arrays to time

    @classmethod
    def from_modules(
        cls, name: str, base, xla, pallas_triton, pallas_mosaic_tpu, ffi_cpu=None
    ) -> Op:
        """The table every kernlib op shares: XLA everywhere, Triton on GPU, Mosaic on TPU,
        and an XLA FFI custom call on CPU where the op has one.

        The op package's modules, in this order: `base` provides the autotuning hooks `spec`,
        `example` and `timed`; each implementation module provides `run` (the Pallas ones
        `Config` and `check`, `ffi_cpu` `check`).
        """
        pallas = {
            PALLAS_TRITON: (pallas_triton, "gpu"),
            PALLAS_MOSAIC_TPU: (pallas_mosaic_tpu, "tpu"),
        }
        implementations = {XLA: Implementation(XLA, xla.run)}
        for impl_name, (module, platform) in pallas.items():
            implementations[impl_name] = Implementation(
                impl_name,
                module.run,
                platform=platform,
                config_cls=module.Config,
                check=module.check,
            )
        if ffi_cpu is not None:
            implementations[FFI_CPU] = Implementation(
                FFI_CPU, ffi_cpu.run, platform="cpu", check=ffi_cpu.check, interpretable=False
            )
        return cls(name, implementations, spec=base.spec, example=base.example, timed=base.timed)


_logged: set[tuple[str, str, str]] = set()


def _log_once(op: str, impl: str, reason: str) -> None:
    key = (op, impl, reason)
    if key not in _logged:
        _logged.add(key)
        logger.warning("kernlib.%s: not using %s (%s); falling back", op, impl, reason)


def _platform_reason(impl: Implementation, plat: str, interpret: bool) -> str | None:
    if impl.platform is None or impl.platform == plat or (interpret and impl.interpretable):
        return None
    if not impl.interpretable:
        return f"{impl.name} runs only on {impl.platform} and the default device is {plat}"
    return (
        f"{impl.name} compiles only for {impl.platform} and the default device is {plat}; "
        f"pass interpret=True to run it in the Pallas interpreter (tests) or use "
        f"implementation='xla'"
    )


def _config_for(impl: Implementation, config: Any, tuned: dict[str, Any] | None) -> Any:
    if impl.config_cls is None:
        if config is not None:
            raise ConfigError(f"implementation {impl.name!r} takes no config, got {config!r}")
        return None
    if config is not None:
        return impl.config_cls.coerce(config)
    if tuned is not None and tuned.get("implementation") == impl.name:
        return impl.config_cls.coerce(tuned.get("config"))
    return impl.config_cls()


def select(
    op: Op,
    implementation: str | None,
    arrays: tuple[Any, ...],
    options: dict[str, Any],
    *,
    config: Any = None,
    interpret: bool = False,
    cache: tuning.TuningCache | None = None,
) -> tuple[Implementation, Any]:
    """Returns (implementation, its config) for this call."""
    plat = device.platform()
    cache = cache or tuning.default_cache()
    spec = op.spec(*arrays, **options)
    tuned = cache.lookup(device.device_kind(), op.name, spec)
    if implementation is not None:
        impl = op.implementations.get(implementation)
        if impl is None:
            raise ConfigError(
                f"{op.name}: unknown implementation {implementation!r}; "
                f"choose one of {sorted(op.implementations)} or None"
            )
        reason = _platform_reason(impl, plat, interpret) or impl.check(*arrays, **options)
        if reason:
            raise UnsupportedError(f"{op.name}: {impl.name} cannot run this call: {reason}")
        return impl, _config_for(impl, config, tuned)

    candidates = list(PREFERENCE.get(plat, (XLA,)))
    # winners measured in the Pallas interpreter are for tests, never a reason to pick a kernel
    if (
        tuned is not None
        and not tuned.get("interpret")
        and tuned.get("implementation") in op.implementations
    ):
        candidates.insert(0, tuned["implementation"])
    for name in dict.fromkeys(candidates):
        impl = op.implementations.get(name)
        if impl is None:
            continue
        reason = _platform_reason(impl, plat, False) or impl.check(*arrays, **options)
        if reason:
            _log_once(op.name, name, reason)
            continue
        return impl, _config_for(impl, config if name != XLA else None, tuned)
    impl = op.implementations[XLA]
    return impl, None


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of an op, checked and split into arrays and static options."""

    op: Op
    arrays: tuple[Any, ...]
    options: dict[str, Any]
    implementation: str | None = None
    config: Any = None
    interpret: bool = False

    def select(self, cache: tuning.TuningCache | None = None) -> tuple[Implementation, Any]:
        return select(
            self.op,
            self.implementation,
            self.arrays,
            self.options,
            config=self.config,
            interpret=self.interpret,
            cache=cache,
        )

    def run(self):
        impl, cfg = self.select()
        return impl.run(*self.arrays, config=cfg, interpret=self.interpret, **self.options)


def public(build: Callable[..., Call]) -> Callable[..., Any]:
    """An op's public function, from `build`: same arguments, checks them and returns the `Call`.

    The function runs that call; `build` stays reachable as its `.call` attribute, so that
    `which_implementation` can choose without running.
    """

    @functools.wraps(build)
    def op(*args, **kwargs):
        return build(*args, **kwargs).run()

    op.call = build
    return op
