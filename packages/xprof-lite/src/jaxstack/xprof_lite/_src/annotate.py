"""Step and host-event annotations: the names the step-time breakdown reads back from a trace.

`step_annotation(step)` is `jax.profiler.StepTraceAnnotation` (XProf's step marker: its overview
page groups time by these). `host_event(kind)` marks host work that is not compute: waiting for
data, saving a checkpoint, compiling. Outside a trace both cost a few hundred nanoseconds.
"""

from __future__ import annotations

import jax

StepTraceAnnotation = jax.profiler.StepTraceAnnotation

DATA_WAIT = "data_wait"
"""The `host_event` kind for time spent waiting for the next batch."""
CHECKPOINT = "checkpoint"
"""The `host_event` kind for time spent saving a checkpoint."""
COMPILE = "compile"
"""The `host_event` kind for time spent compiling."""
HOST_EVENT_KINDS = (DATA_WAIT, CHECKPOINT, COMPILE)


def step_annotation(step: int, name: str = "train") -> jax.profiler.StepTraceAnnotation:
    """Mark one step of a training (`name="train"`) or serving (`name="serve"`) loop.

    Example:
        for step in range(num_steps):
            with xprof_lite.step_annotation(step):
                state, metrics = train_step(state, next(batches))
    """
    return jax.profiler.StepTraceAnnotation(name, step_num=int(step))


def host_event(kind: str, **metadata) -> jax.profiler.TraceAnnotation:
    """Mark host work of one kind (`data_wait`, `checkpoint`, `compile`, or your own name).

    Example:
        with xprof_lite.host_event(xprof_lite.DATA_WAIT):
            batch = next(batches)
    """
    return jax.profiler.TraceAnnotation(kind, **metadata)
