"""Compiling for TPU chips this machine does not have (ahead of time, as MaxText's train_compile).

With `libtpu` installed next to jax, `jax.experimental.topologies` describes TPU slices on a CPU
host (`JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1`), and `jax.jit(f).lower(...).compile()` on their
devices runs the real TPU compiler: Mosaic kernels are lowered and compiled for the chip, and the
executable reports its memory and the TPU cost model's estimate. Nothing runs; a compile check
never replaces a run on a chip.

    >>> devices = tpu_devices("v6e")
    >>> result = aot_compile(fn, args, devices[0])   # an AotResult: compiled or refused, why
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from jaxstack.kernlib._src import device as device_lib
from jaxstack.kernlib._src.errors import UnsupportedError


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """A small TPU slice to compile for: `topology` as jax names it and its chip config."""

    name: str
    topology: str
    chip_config: str = "default"
    chips_per_host: tuple[int, int, int] = (2, 2, 1)


TPU_TARGETS: dict[str, TpuTarget] = {
    "v5e": TpuTarget("v5e", "v5e:2x2"),
    "v5p": TpuTarget("v5p", "v5p:2x2x1", "megacore"),
    "v6e": TpuTarget("v6e", "v6e:2x2"),
}
"""The TPU slices kernels are compiled for ahead of time on a CPU machine (`aot_compile`,
`nox -s tpu_aot`), by chip name: v5e, v5p (megacore) and v6e, 2x2 chips each."""

LIBTPU_HINT = (
    "install libtpu next to jax (`pip install libtpu`, or `nox -s tpu_aot`) and set "
    "JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 on a machine without TPUs"
)


def tpu_devices(target: str | TpuTarget) -> list[jax.Device]:
    """The devices of a described TPU slice ("v5e", "v5p", "v6e" or a `TpuTarget`)."""
    if isinstance(target, str):
        if target not in TPU_TARGETS:
            choices = list(TPU_TARGETS)
            raise UnsupportedError(f"unknown TPU target {target!r}; choose one of {choices}")
        target = TPU_TARGETS[target]
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(
            topology_name=target.topology,
            platform="tpu",
            chip_config_name=target.chip_config,
            chips_per_host_bounds=target.chips_per_host,
            num_slices=1,
        )
    except Exception as error:  # jax raises RuntimeError or ValueError, depending on the cause
        raise UnsupportedError(
            f"cannot describe TPU slice {target.topology}: {_first_line(error)}; {LIBTPU_HINT}"
        ) from error
    return list(topology.devices)


@contextlib.contextmanager
def target_device(device: jax.Device, mesh: jax.sharding.Mesh | None = None) -> Iterator[None]:
    """Trace for `device`: kernlib dispatch chooses for its platform and kind, and Pallas Mosaic
    lowers for its chip, through the abstract mesh of `mesh` (a program over several chips,
    whose kernels are called inside `jax.shard_map`) or else of that one device."""
    token = device_lib._TARGET.set(device)
    try:
        mesh = mesh or jax.sharding.Mesh(np.array([device]), ("device",))
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            yield
    finally:
        device_lib._TARGET.reset(token)


@dataclasses.dataclass(frozen=True)
class AotResult:
    """One ahead-of-time compilation: compiled, or refused with the compiler's reason."""

    device_kind: str
    compiled: bool
    reason: str | None = None
    compile_s: float | None = None
    mosaic_kernels: int = 0  # Mosaic custom calls in the lowered program
    flops: float | None = None  # the TPU cost model's figures for the whole program
    bytes_accessed: float | None = None
    optimal_seconds: float | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def with_backward(fn: Callable[..., Any], argnums: Sequence[int]) -> Callable[..., Any]:
    """fn(*args) -> out becomes fn(*args) -> (out, grads of args[argnums] for cotangent out), so
    one program holds the forward and the backward kernels."""

    def both(*args):
        def part(*diff):
            full = list(args)
            for i, a in zip(argnums, diff, strict=True):
                full[i] = a
            return fn(*full)

        out, vjp = jax.vjp(part, *(args[i] for i in argnums))
        return out, vjp(out)

    return both


def aot_compile(fn: Callable[..., Any], args: Sequence[Any], device: jax.Device) -> AotResult:
    """Lowers and compiles `jax.jit(fn)` for `device` (from `tpu_devices`), `args` being arrays or
    ShapeDtypeStructs placed there; a lowering or compiler error is a refusal with its reason."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    specs = [
        None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
        for a in args
    ]
    start = time.perf_counter()
    try:
        with target_device(device):
            lowered = jax.jit(fn).lower(*specs)
        compiled = lowered.compile()
    except Exception as error:  # the compiler's own exception types vary by version
        return AotResult(device.device_kind, False, reason=_first_line(error))
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    memory = compiled.memory_analysis()
    return AotResult(
        device.device_kind,
        True,
        compile_s=seconds,
        mosaic_kernels=lowered.as_text().count("@tpu_custom_call"),
        flops=cost.get("flops"),
        bytes_accessed=cost.get("bytes accessed"),
        optimal_seconds=cost.get("optimal_seconds"),
        argument_bytes=getattr(memory, "argument_size_in_bytes", None),
        output_bytes=getattr(memory, "output_size_in_bytes", None),
        temp_bytes=getattr(memory, "temp_size_in_bytes", None),
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    line = text.splitlines()[0]
    return f"{type(error).__name__}: {line[:300]}"
