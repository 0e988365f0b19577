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

from jaxstack.xprof_lite._src.annotate import (
    CHECKPOINT,
    COMPILE,
    DATA_WAIT,
    StepTraceAnnotation,
    host_event,
    step_annotation,
)
from jaxstack.xprof_lite._src.capture import Capture, save_hlo, trace
from jaxstack.xprof_lite._src.cost import CATEGORIES
from jaxstack.xprof_lite._src.errors import Error
from jaxstack.xprof_lite._src.machine import (
    HOST_ALLOCATORS,
    HostAllocatorTrial,
    HostCPU,
    SettingTrial,
    choose_host_allocator,
    host_cpu,
    set_host_allocator,
)
from jaxstack.xprof_lite._src.memory import (
    LiveArray,
    compiled_memory,
    live_arrays,
    live_bytes_by_origin,
    peak_memory_per_step,
)
from jaxstack.xprof_lite._src.op_profile import (
    OpProfile,
    OpStat,
    analyze_hlo,
    op_profile,
    profile_from_trace,
)
from jaxstack.xprof_lite._src.peak import (
    SPEC_TABLE,
    DevicePeak,
    SpecRow,
    device_peak,
    measure_matmul_flops,
    measure_peak,
    spec_peak,
)
from jaxstack.xprof_lite._src.report import Report, report, report_logdir
from jaxstack.xprof_lite._src.roofline import RooflinePoint, roofline
from jaxstack.xprof_lite._src.steps import StepBreakdown, step_breakdown, step_windows
from jaxstack.xprof_lite._src.tracefile import hlo_op_times
from jaxstack.xprof_lite._src.tracefile import load as load_trace
from jaxstack.xprof_lite._src.window import StepWindowProfiler

__all__ = [
    "CATEGORIES",
    "CHECKPOINT",
    "COMPILE",
    "DATA_WAIT",
    "HOST_ALLOCATORS",
    "SPEC_TABLE",
    "Capture",
    "DevicePeak",
    "Error",
    "HostAllocatorTrial",
    "HostCPU",
    "LiveArray",
    "OpProfile",
    "OpStat",
    "Report",
    "RooflinePoint",
    "SettingTrial",
    "SpecRow",
    "StepBreakdown",
    "StepTraceAnnotation",
    "StepWindowProfiler",
    "analyze_hlo",
    "choose_host_allocator",
    "compiled_memory",
    "device_peak",
    "hlo_op_times",
    "host_cpu",
    "host_event",
    "live_arrays",
    "live_bytes_by_origin",
    "load_trace",
    "measure_matmul_flops",
    "measure_peak",
    "op_profile",
    "peak_memory_per_step",
    "profile_from_trace",
    "report",
    "report_logdir",
    "roofline",
    "save_hlo",
    "set_host_allocator",
    "spec_peak",
    "step_annotation",
    "step_breakdown",
    "step_windows",
    "trace",
]
