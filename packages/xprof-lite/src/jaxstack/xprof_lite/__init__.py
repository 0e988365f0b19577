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

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.xprof_lite, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.annotate": [
            "CHECKPOINT",
            "COMPILE",
            "DATA_WAIT",
            "StepTraceAnnotation",
            "host_event",
            "step_annotation",
        ],
        "_src.capture": ["Capture", "save_hlo", "trace"],
        "_src.cost": ["CATEGORIES"],
        "_src.errors": ["Error"],
        "_src.machine": [
            "HOST_ALLOCATORS",
            "HostAllocatorTrial",
            "HostCPU",
            "SettingTrial",
            "choose_host_allocator",
            "host_cpu",
            "set_host_allocator",
        ],
        "_src.memory": [
            "LiveArray",
            "compiled_memory",
            "live_arrays",
            "live_bytes_by_origin",
            "peak_memory_per_step",
        ],
        "_src.op_profile": [
            "OpProfile",
            "OpStat",
            "analyze_hlo",
            "op_profile",
            "profile_from_trace",
        ],
        "_src.peak": [
            "SPEC_TABLE",
            "DevicePeak",
            "SpecRow",
            "device_peak",
            "measure_matmul_flops",
            "measure_peak",
            "spec_peak",
        ],
        "_src.report": ["Report", "report", "report_logdir"],
        "_src.roofline": ["RooflinePoint", "roofline"],
        "_src.steps": ["StepBreakdown", "step_breakdown", "step_windows"],
        "_src.tracefile": ["hlo_op_times", "load_trace"],
        "_src.window": ["StepWindowProfiler"],
    },
)
