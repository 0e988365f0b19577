"""`jaxstack-train --aot-topology v5p-128`: the real train step compiled for a TPU slice, here.

As MaxText's train_compile: with libtpu installed next to jax, `jax.experimental.topologies`
describes the slice on a CPU machine (`JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1`), the train step
is lowered on ShapeDtypeStructs carrying the run's shardings over the slice's devices (see
`dry_run`), and the TPU compiler compiles it. Nothing is allocated and nothing runs: the report
gives memory per chip against the chip's HBM (xprof-lite's device table), the model FLOPs per
step, and the step time and MFU that the TPU cost model predicts.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax

from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.dry_run import dry_run
from jaxstack.trainer._src.errors import ConfigError, Error

LIBTPU_HINT = (
    "install libtpu next to jax (pip install libtpu) and set JAX_PLATFORMS=cpu "
    "TPU_SKIP_MDS_QUERY=1 on a machine without TPUs"
)
# chips per slice -> topology; v5e / v6e slices are 2D, v5p slices 3D (Cloud TPU docs' shapes)
_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
}
# name -> (topologies, cores per chip in the slice's name, chip config)
_FAMILIES = {"v5e": (_2D, 1, "default"), "v6e": (_2D, 1, "default"), "v5p": (_3D, 2, "megacore")}


_FIT_HINT = (
    "Use a larger slice, a smaller data.batch_size, model.remat=full, or a mesh with a data axis "
    "(--mesh data=16,fsdp=4): activations are not sharded over fsdp yet."
)


class AotError(Error):
    """The slice cannot be described here, or the step does not fit the chip's HBM."""


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    """A TPU slice as Cloud TPU names it ("v5p-128": 128 TensorCores = 64 chips)."""

    name: str
    family: str
    topology: str
    chips: int
    chip_config: str

    @classmethod
    def parse(cls, name: str) -> TpuSlice:
        m = re.fullmatch(r"(v5e|v5p|v6e)-(\d+)", name.strip().lower())
        if not m:
            raise ConfigError(
                f"--aot-topology {name!r} is not a TPU slice name; use e.g. v5e-16, v6e-256 or "
                f"v5p-128 (v5p counts TensorCores, 2 per chip)"
            )
        family, count = m.group(1), int(m.group(2))
        shapes, cores, chip_config = _FAMILIES[family]
        chips = count // cores
        if count % cores or chips not in shapes:
            sizes = ", ".join(f"{family}-{c * cores}" for c in shapes)
            raise ConfigError(f"--aot-topology {name!r}: no such slice; choose one of {sizes}")
        return cls(name, family, f"{family}:{shapes[chips]}", chips, chip_config)

    def devices(self) -> list[jax.Device]:
        from jax.experimental import topologies

        bounds = (1, 1, 1) if self.chips == 1 else (2, 2, 1)
        try:
            topology = topologies.get_topology_desc(
                topology_name=self.topology,
                platform="tpu",
                chip_config_name=self.chip_config,
                chips_per_host_bounds=bounds,
                num_slices=1,
            )
        except Exception as e:  # RuntimeError without libtpu, ValueError for a bad shape
            raise AotError(
                f"cannot describe TPU slice {self.name} ({self.topology}): {e}; {LIBTPU_HINT}"
            ) from e
        return list(topology.devices)


def aot_train_compile(
    config: Config, topology: str, mesh_sizes: dict[str, int] | None = None
) -> dict[str, Any]:
    """Compiles the train step of `config` for the TPU slice `topology` ("v5p-128"); returns the
    dry-run report plus the chip, its HBM, whether the step fits, the cost model's predicted step
    time and the MFU it implies. Raises AotError (after filling the report) when it does not fit.
    """
    from jaxstack import xprof_lite

    tpu = TpuSlice.parse(topology)
    devices = tpu.devices()
    kind = devices[0].device_kind
    try:
        report = dry_run(config, mesh_sizes, devices=devices)
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        lines = str(e).splitlines()
        said = next((x for x in lines if "exceeds" in x or "out of memory" in x), lines[0])
        raise AotError(
            f"the train step does not fit {tpu.name} ({kind}); the TPU compiler says: "
            f"{said.strip()} {_FIT_HINT}"
        ) from e
    peak = xprof_lite.spec_peak(kind)
    report = {"slice": f"{tpu.name} ({tpu.topology}, {tpu.chips} chips)", "chip": kind, **report}
    if peak is not None:
        report["hbm_bytes_per_chip"] = peak.hbm_bytes
        report["peak_bf16_flops_per_chip"] = peak.flops_per_s
    seconds = report.get("cost_model_seconds_loops_once")
    seen = report.get("xla_flops_per_device_loops_once")
    if seconds and seen and peak is not None:
        # The cost model, like XLA's FLOP count, sees a while-loop body once (the scan over
        # layers, gradient accumulation): its time is scaled by the FLOPs it did not see.
        flops = report["model_flops_per_step_per_device"]
        report["predicted_step_seconds"] = seconds * max(1.0, flops / seen)
        report["predicted_mfu"] = flops / (report["predicted_step_seconds"] * peak.flops_per_s)
    used = report.get("peak_bytes_per_device")
    if used is not None and peak is not None and peak.hbm_bytes:
        report["fits_hbm"] = used <= peak.hbm_bytes
    return report


def check_fits(report: dict[str, Any]) -> None:
    """Raises AotError naming the numbers when the step's memory exceeds the chip's HBM."""
    if report.get("fits_hbm") is False:
        used, hbm = report["peak_bytes_per_device"], report["hbm_bytes_per_chip"]
        raise AotError(
            f"the step needs {used / 2**30:,.1f} GiB per chip on {report['slice']}, more than "
            f"the {report['chip']}'s {hbm / 2**30:,.1f} GiB HBM. {_FIT_HINT}"
        )


def _scaled(value: float, units: tuple[tuple[float, str], ...]) -> str:
    for scale, unit in units:
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {unit}"
    scale, unit = units[-1]
    return f"{value / scale:,.2f} {unit}"


def format_aot_report(report: dict[str, Any]) -> str:
    gib = lambda b: _scaled(b, ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")))
    flop = lambda f: _scaled(f, ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")))
    sec = lambda t: f"{t:.3f} s" if t >= 0.1 else f"{t * 1e3:.3f} ms"
    lines = [f"ahead-of-time compile for {report['slice']}, {report['chip']} (nothing ran):"]
    for key in ("model", "num_params", "mesh", "batch", "dtype", "seconds"):
        value = report.get(key)
        if key == "num_params":
            value = f"{value / 1e9:,.2f} B"
        elif key == "seconds":
            key, value = "compile_seconds", f"{value:.1f}"
        lines.append(f"  {key:28s} {value}")
    hbm = report.get("hbm_bytes_per_chip")
    for key in ("argument", "output", "temp", "alias", "peak"):
        b = report.get(f"{key}_bytes_per_device")
        if b is not None:
            lines.append(f"  {key + ' bytes per chip':28s} {gib(b)}")
    if hbm:
        verdict = "fits" if report.get("fits_hbm") else "DOES NOT FIT"
        share = report.get("peak_bytes_per_device", 0) / hbm
        lines.append(f"  {'HBM per chip':28s} {gib(hbm)} ({share:.0%} used: {verdict})")
    lines.append(
        f"  {'model FLOPs per step':28s} {flop(report['model_flops_per_step'])} "
        f"({flop(report['model_flops_per_step_per_device'])} per chip)"
    )
    if "predicted_step_seconds" in report:
        lines.append(
            f"  {'predicted step time':28s} {sec(report['predicted_step_seconds'])} (TPU cost "
            f"model {sec(report['cost_model_seconds_loops_once'])} with loop bodies once, "
            "scaled by the model FLOPs it did not see)"
        )
        lines.append(f"  {'predicted MFU':28s} {report['predicted_mfu']:.1%}")
    return "\n".join(lines)
