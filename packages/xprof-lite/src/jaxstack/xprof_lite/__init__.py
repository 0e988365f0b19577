"""jaxstack.xprof_lite: capture, op profile, roofline, memory and step-time reports on jax.profiler.

from jaxstack import xprof_lite

with xprof_lite.trace("/tmp/prof"):              # XProf-compatible logdir + trace.json
    for step in range(5):
        with xprof_lite.step_annotation(step):
            state = train_step(state, batch)

prof = xprof_lite.op_profile(train_step, state, batch, measure=3)   # per-op FLOPs/bytes/time
points = xprof_lite.roofline(prof, xprof_lite.device_peak())
xprof_lite.report(train_step, state, batch, out_dir="/tmp/prof-report")
"""

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.xprof_lite, or a command's --help, does not import JAX.
_EXPORTS = {
    "CHECKPOINT": "annotate",
    "COMPILE": "annotate",
    "DATA_WAIT": "annotate",
    "StepTraceAnnotation": "annotate",
    "host_event": "annotate",
    "step_annotation": "annotate",
    "Capture": "capture",
    "save_hlo": "capture",
    "trace": "capture",
    "CATEGORIES": "cost",
    "Error": "errors",
    "HOST_ALLOCATORS": "machine",
    "HostAllocatorTrial": "machine",
    "HostCPU": "machine",
    "SettingTrial": "machine",
    "choose_host_allocator": "machine",
    "host_cpu": "machine",
    "set_host_allocator": "machine",
    "LiveArray": "memory",
    "compiled_memory": "memory",
    "live_arrays": "memory",
    "live_bytes_by_origin": "memory",
    "peak_memory_per_step": "memory",
    "OpProfile": "op_profile",
    "OpStat": "op_profile",
    "analyze_hlo": "op_profile",
    "op_profile": "op_profile",
    "profile_from_trace": "op_profile",
    "SPEC_TABLE": "peak",
    "DevicePeak": "peak",
    "SpecRow": "peak",
    "device_peak": "peak",
    "measure_matmul_flops": "peak",
    "measure_peak": "peak",
    "spec_peak": "peak",
    "Report": "report",
    "report": "report",
    "report_logdir": "report",
    "RooflinePoint": "roofline",
    "roofline": "roofline",
    "StepBreakdown": "steps",
    "step_breakdown": "steps",
    "step_windows": "steps",
    "hlo_op_times": "tracefile",
    "load_trace": "tracefile:load",
    "StepWindowProfiler": "window",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")  # "module:attribute" when renamed
    value = getattr(importlib.import_module(f"{__name__}._src.{module}"), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
