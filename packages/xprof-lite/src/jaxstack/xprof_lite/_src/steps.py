"""Step-time breakdown of an annotated loop: where each step's wall time went.

Each `step_annotation(step)` span is split into compile (jax's own lowering/compile events or a
`host_event("compile")`), checkpoint (`host_event("checkpoint")`), host/data wait
(`host_event("data_wait")`) and compute (the rest: dispatch and waiting for the device). Nested or
overlapping events are counted once, in that order of precedence. `device_busy_ms` is the union of
HLO-op execution inside the step (on CPU, XLA's own threads).
"""

from __future__ import annotations

import dataclasses
import re

from jaxstack.xprof_lite._src import tracefile

COMPILE_EVENTS = re.compile(
    r"^(compile|backend_compile.*|lower_sharding_computation|jit_lower.*|trace_to_jaxpr.*|"
    r"pjit_lower.*|CompileCpuExecutable|PjRtCompile.*)$"
)
CHECKPOINT_EVENTS = re.compile(r"^(checkpoint.*|save_checkpoint.*|restore_checkpoint.*)$")
DATA_EVENTS = re.compile(r"^(data_wait.*|data_loading.*|next_batch.*)$")


@dataclasses.dataclass(frozen=True)
class StepWindow:
    name: str
    step: int
    start_ns: float
    end_ns: float


@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    """Where one annotated step's wall time went, in milliseconds: compile, checkpoint, data wait
    and compute (the rest), plus `device_busy_ms`, the time HLO ops ran inside the step."""

    step: int
    name: str
    total_ms: float
    compute_ms: float
    data_wait_ms: float
    compile_ms: float
    checkpoint_ms: float
    device_busy_ms: float


def step_windows(data) -> list[StepWindow]:
    """Every annotated step in the trace, in time order."""
    seen = set()
    windows = []
    for e in tracefile.events(tracefile.load_trace(data)):
        if "step_num" in e.stats and not e.plane.startswith("/device:"):
            key = (e.name, e.stats["step_num"], e.start_ns)
            if key not in seen:
                seen.add(key)
                windows.append(StepWindow(e.name, int(e.stats["step_num"]), e.start_ns, e.end_ns))
    return sorted(windows, key=lambda w: w.start_ns)


def step_breakdown(data) -> list[StepBreakdown]:
    """Per-step compute / data wait / compile / checkpoint milliseconds from a trace."""
    data = tracefile.load_trace(data)
    compile_iv, ckpt_iv, data_iv, ops_iv = [], [], [], []
    device_ops = False
    for e in tracefile.events(data):
        span = (e.start_ns, e.end_ns)
        if tracefile.hlo_identity(e) is not None:
            ops_iv.append((e.plane.startswith("/device:"), span))
            device_ops = device_ops or e.plane.startswith("/device:")
        elif COMPILE_EVENTS.match(e.name):
            compile_iv.append(span)
        elif CHECKPOINT_EVENTS.match(e.name):
            ckpt_iv.append(span)
        elif DATA_EVENTS.match(e.name):
            data_iv.append(span)
    ops = [span for on_device, span in ops_iv if on_device == device_ops]
    compile_iv, ckpt_iv, data_iv, ops = map(
        tracefile.merge_intervals, (compile_iv, ckpt_iv, data_iv, ops)
    )
    rows = []
    for w in step_windows(data):
        lo, hi = w.start_ns, w.end_ns
        compile_ns = tracefile.covered_ns(compile_iv, lo, hi)
        upto_ckpt = tracefile.covered_ns(compile_iv + ckpt_iv, lo, hi)
        upto_data = tracefile.covered_ns(compile_iv + ckpt_iv + data_iv, lo, hi)
        total = hi - lo
        rows.append(
            StepBreakdown(
                step=w.step,
                name=w.name,
                total_ms=total / 1e6,
                compute_ms=(total - upto_data) / 1e6,
                data_wait_ms=(upto_data - upto_ckpt) / 1e6,
                compile_ms=compile_ns / 1e6,
                checkpoint_ms=(upto_ckpt - compile_ns) / 1e6,
                device_busy_ms=tracefile.covered_ns(ops, lo, hi) / 1e6,
            )
        )
    return rows
