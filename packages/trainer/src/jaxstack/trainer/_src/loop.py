"""`train(config)`: the training loop, readable top to bottom.

    setup (startup)  -> compile (ahead of time) -> for each step: data, step, log,
                        eval every N, checkpoint every N -> final eval, checkpoint, sample, report

Every second is attributed to a goodput bucket. Details live in named helpers below and in the
sibling modules (`session.py` builds the run: mesh, model, optimiser, state, data).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import jax

from jaxstack.trainer._src import data as data_mod
from jaxstack.trainer._src import extras
from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.goodput import GoodputTracker
from jaxstack.trainer._src.host_memory import retain_freed_host_memory
from jaxstack.trainer._src.metrics_log import MetricsLog
from jaxstack.trainer._src.report import write_report
from jaxstack.trainer._src.session import Session, build_session

Callback = Callable[[int, dict[str, Any], dict[str, float]], None]


@dataclasses.dataclass
class TrainResult:
    """What a run leaves behind: where, how far, final numbers, the state itself."""

    run_dir: pathlib.Path
    step: int
    summary: dict[str, Any]
    eval: dict[str, float] | None
    sample: str | None
    state: dict[str, Any]


def train(
    config: Config,
    *,
    callbacks: Sequence[Callback] = (),
    start_time: float | None = None,
) -> TrainResult:
    """Trains as `config` says, resuming from the run directory's latest checkpoint if any.

    `callbacks` are called as `cb(step, state, metrics)` after every step (after any checkpoint
    of that step). `start_time` (a `time.perf_counter()` value) lets a CLI count its own imports
    as startup time in the goodput breakdown.
    """
    tracker = GoodputTracker(start_time)
    if config.train.host_allocator == "retain":
        retain_freed_host_memory()
    with tracker.measure("startup"):
        s = build_session(config)
    log = MetricsLog(
        s.run_dir,
        total_steps=config.train.steps,
        every=config.log.every,
        tensorboard=config.log.tensorboard,
        progress=config.log.progress,
        enabled=s.is_chief,
    )
    try:
        return _run(config, s, log, tracker, callbacks)
    finally:
        log.close()
        s.close()


def _run(
    config: Config,
    s: Session,
    log: MetricsLog,
    tracker: GoodputTracker,
    callbacks: Sequence[Callback],
) -> TrainResult:
    for line in s.describe():
        log.info(line)
    with tracker.measure("compile"):
        t = time.perf_counter()
        train_step, eval_step = s.compile()
    log.info(f"compiled train and eval steps in {time.perf_counter() - t:.1f}s")

    tokens_per_step = config.data.batch_size * config.data.seq_len
    step = s.start_step
    state = s.state
    prefetch = data_mod.Prefetcher(
        s.train_iterators,
        s.put_batch,
        depth=config.data.prefetch,
        limit=max(0, config.train.steps - step),
    )
    history: list[dict[str, float]] = []
    eval_metrics: dict[str, float] | None = None
    data_states = s.data_states
    last_saved = step if s.restored else -1
    diverged = False
    profiler = extras.step_profiler(config, s.run_dir) if s.is_chief else None
    log.start(step)
    try:
        while step < config.train.steps:
            with tracker.measure("data_wait"):
                batch, data_states = prefetch.next()
            t = time.perf_counter()
            with profiler.step(step) if profiler else nullcontext():
                state, device_metrics = train_step(state, batch)
                metrics = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
            dt = time.perf_counter() - t
            tracker.add("step", dt)
            step += 1
            metrics.update(_speed(dt, tokens_per_step, s))
            metrics["goodput"] = tracker.summary()["goodput"]
            history.append(metrics)
            log.train(step, metrics)
            if not math.isfinite(metrics["loss"]):
                log.info(f"loss is {metrics['loss']} at step {step}; stopping (state not saved)")
                diverged = True
                break
            if config.eval.every and step % config.eval.every == 0 and step < config.train.steps:
                with tracker.measure("eval"):
                    eval_metrics = s.evaluate(eval_step, state["params"])
                log.eval(step, eval_metrics)
            preempted = s.preemption_requested()
            if s.manager is not None and (step % config.checkpoint.every == 0 or preempted):
                with tracker.measure("checkpoint"):
                    s.save(step, state, data_states, metrics)
                last_saved = step
            for cb in callbacks:
                cb(step, state, metrics)
            if preempted:
                log.info(f"preemption requested: saved step {step} and stopping")
                break
    finally:
        prefetch.close()
        if profiler:
            profiler.close()

    if step == config.train.steps or eval_metrics is None:
        with tracker.measure("eval"):
            eval_metrics = s.evaluate(eval_step, state["params"])
        log.eval(step, eval_metrics)
    if s.manager is not None:
        with tracker.measure("checkpoint"):
            if last_saved != step and not diverged:
                s.save(step, state, data_states, history[-1] if history else {})
            s.manager.wait()
    with tracker.measure("eval"):
        sample = s.sample(state["params"])
    if sample is not None:
        log.info(f"sample: {sample!r}")
    summary = _summary(config, s, tracker, history, eval_metrics, step)
    summary["sample"] = sample or ""
    log.summary(step, summary)
    if s.is_chief:
        log.info(_goodput_line(summary))
        if config.log.report:
            path = write_report(s.run_dir, sample=sample)
            log.info(f"report: {path}")
    return TrainResult(s.run_dir, step, summary, eval_metrics, sample, state)


def _speed(dt: float, tokens: int, s: Session) -> dict[str, float]:
    flops = s.flops_per_token * tokens
    return {
        "step_time_s": dt,
        "tokens_per_sec": tokens / dt,
        "mfu": flops / (dt * s.total_peak_flops) if s.total_peak_flops > 0 else float("nan"),
    }


def _summary(
    config: Config,
    s: Session,
    tracker: GoodputTracker,
    history: list[dict[str, float]],
    eval_metrics: dict[str, float] | None,
    step: int,
) -> dict[str, Any]:
    # The first steps after compile are often slower (allocations, caches); report steady state.
    steady = history[min(len(history) - 1, 2) :] if history else []
    out: dict[str, Any] = {"final_step": step}
    if history:
        out["first_loss"] = history[0]["loss"]
        out["final_loss"] = history[-1]["loss"]
        for key in ("tokens_per_sec", "step_time_s", "mfu"):
            out[f"median_{key}"] = statistics.median(m[key] for m in steady)
    if eval_metrics:
        out.update(eval_metrics)
    out["peak_flops_per_device"] = s.peak.flops_per_sec
    out["peak_source"] = s.peak.source
    out["flops_per_token"] = s.flops_per_token
    out["num_params"] = s.num_params
    out["mesh"] = "x".join(str(v) for v in s.mesh_sizes.values())
    out.update(tracker.summary())
    return out


def _goodput_line(summary: dict[str, Any]) -> str:
    lost = ", ".join(
        f"{k.removeprefix('lost_').removesuffix('_s')} {v:.1f}s"
        for k, v in summary.items()
        if k.startswith("lost_") and v >= 0.05
    )
    return (
        f"goodput {summary['goodput']:.1%} of {summary['wall_s']:.1f}s wall "
        f"(steps {summary['step_s']:.1f}s; lost: {lost or 'none'})"
    )
