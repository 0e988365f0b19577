"""`train(config)`: the training loop, readable top to bottom.

    setup (startup)  -> compile (ahead of time) -> for each step: data, step, log,
                        eval every N, checkpoint every N -> final eval, checkpoint, sample, report

A stop signal (SIGTERM, SIGINT; signals.py) ends the loop at the next step boundary: the step
reached is checkpointed and `train` returns at once, without the final evaluation, sample or
report. Every second is attributed to a goodput bucket. Details live in named helpers below and
in the sibling modules (`session.py` builds the run: mesh, model, optimiser, state, data).
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
from jaxstack.trainer._src import extras, matmul_backend
from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.goodput import GoodputTracker
from jaxstack.trainer._src.metrics_log import MetricsLog
from jaxstack.trainer._src.report import write_report
from jaxstack.trainer._src.session import Session, build_session
from jaxstack.trainer._src.signals import STOP, Stopped
from jaxstack.xprof_lite import HostAllocatorTrial, SettingTrial, set_host_allocator

Callback = Callable[[int, dict[str, Any], dict[str, float]], None]


@dataclasses.dataclass
class TrainResult:
    """What a run leaves behind: where, how far, final numbers, the state itself.

    `stopped` is the signal name ("SIGTERM", "SIGINT") when a stop signal ended the run early
    (then `saved_on_stop` says whether the step reached was checkpointed), else None.
    """

    run_dir: pathlib.Path
    step: int
    summary: dict[str, Any]
    eval: dict[str, float] | None
    sample: str | None
    state: dict[str, Any]
    stopped: str | None = None
    stop_signal: int | None = None
    saved_on_stop: bool = False


@dataclasses.dataclass
class _Progress:
    """Where the loop is: the state after `step`, and what has been kept of it."""

    step: int
    state: dict[str, Any]
    data_states: list[dict[str, Any]]
    last_saved: int
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    eval_metrics: dict[str, float] | None = None
    diverged: bool = False
    host_allocator: str = "system"
    train_steps: dict[str, Any] = dataclasses.field(default_factory=dict)  # by matmul backend
    matmul_backend: str = "default"  # whose train step runs next
    # Timed trials of settings, run one after the other over the first steps (see _trials).
    trials: list[SettingTrial] = dataclasses.field(default_factory=list)
    trial_steps: int = 0  # steps taken while a trial ran


def train(
    config: Config,
    *,
    callbacks: Sequence[Callback] = (),
    start_time: float | None = None,
) -> TrainResult:
    """Trains as `config` says, resuming from the run directory's latest checkpoint if any.

    `callbacks` are called as `cb(step, state, metrics)` after every step (after any checkpoint
    of that step). `start_time` (a `time.perf_counter()` value) lets a CLI count its own imports
    as startup time in the goodput breakdown. With `checkpoint.on_preemption`, SIGTERM or SIGINT
    saves the step reached and returns early (`TrainResult.stopped`) without the final
    evaluation, sample or report.
    """
    tracker = GoodputTracker(start_time)
    trial, allocator = _host_allocator(config)
    own_handler = config.checkpoint.on_preemption and not STOP.installed and STOP.install()
    if own_handler:
        STOP.deferred = True  # called as a library: record signals from the start
    try:
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
            return _run(config, s, log, tracker, callbacks, trial, allocator)
        finally:
            log.close()
            s.close()
    finally:
        if own_handler:
            STOP.uninstall()


def _run(
    config: Config,
    s: Session,
    log: MetricsLog,
    tracker: GoodputTracker,
    callbacks: Sequence[Callback],
    allocator_trial: HostAllocatorTrial | None,
    host_allocator: str,
) -> TrainResult:
    for line in s.describe():
        log.info(line)
    with tracker.measure("compile"):
        t = time.perf_counter()
        train_steps, eval_step = s.compile()
    log.info(f"compiled train and eval steps in {time.perf_counter() - t:.1f}s")
    if s.matmul_backend:
        log.info(f"matmul backend: {s.matmul_backend} ({s.matmul_note})")

    p = _Progress(s.start_step, s.state, s.data_states, s.start_step if s.restored else -1)
    p.host_allocator, p.train_steps = host_allocator, train_steps
    p.matmul_backend = s.matmul_backend or "default"
    p.trials = _trials(allocator_trial, p)
    save_on_stop = s.manager is not None and config.checkpoint.on_preemption
    # Start-up ends: a signal that reached any process during it (or one whose `Stopped` Python
    # swallowed) stops every process here, before the first step, with nothing new to save.
    if STOP.agreed():
        raise Stopped(STOP.signum)
    # From here a stop signal waits for the step boundary, where the step reached is saved.
    STOP.deferred = STOP.deferred or save_on_stop
    try:
        _steps(config, s, log, tracker, callbacks, eval_step, p)
        if STOP.agreed():
            return _stop(config, s, log, tracker, p)
        return _finish(config, s, log, tracker, eval_step, p)
    except Stopped as e:
        why = "a second signal" if save_on_stop else "checkpointing off or on_preemption=false"
        latest = p.last_saved if p.last_saved >= 0 else "none"
        e.detail = (
            f"at step {p.step} of {config.train.steps} without saving it ({why}); "
            f"latest checkpoint: {latest}"
        )
        raise


def _finish(
    config: Config,
    s: Session,
    log: MetricsLog,
    tracker: GoodputTracker,
    eval_step: Any,
    p: _Progress,
) -> TrainResult:
    """Final evaluation, checkpoint, sample, summary and report (a stop signal skips the rest)."""
    if p.step == config.train.steps or p.eval_metrics is None:
        with tracker.measure("eval"):
            p.eval_metrics = s.evaluate(eval_step, p.state["params"])
        log.eval(p.step, p.eval_metrics)
    if s.manager is not None:
        with tracker.measure("checkpoint"):
            if p.last_saved != p.step and not p.diverged:
                s.save(p.step, p.state, p.data_states, p.history[-1] if p.history else {})
                p.last_saved = p.step
            s.manager.wait()
    if STOP.agreed():
        return _stop(config, s, log, tracker, p)
    with tracker.measure("eval"):
        sample = s.sample(p.state["params"])
    if sample is not None:
        log.info(f"sample: {sample!r}")
    summary = _summary(config, s, tracker, p)
    summary["sample"] = sample or ""
    log.summary(p.step, summary)
    if s.is_chief:
        log.info(_goodput_line(summary))
        if config.log.report:
            path = write_report(s.run_dir, sample=sample)
            log.info(f"report: {path}")
    return TrainResult(s.run_dir, p.step, summary, p.eval_metrics, sample, p.state)


def _steps(
    config: Config,
    s: Session,
    log: MetricsLog,
    tracker: GoodputTracker,
    callbacks: Sequence[Callback],
    eval_step: Any,
    p: _Progress,
) -> None:
    """Steps until train.steps, a non-finite loss or a stop signal; checkpoints and evals."""
    tokens_per_step = config.data.batch_size * config.data.seq_len
    prefetch = data_mod.Prefetcher(
        s.train_iterators,
        s.put_batch,
        depth=config.data.prefetch,
        limit=max(0, config.train.steps - p.step),
    )
    profiler = extras.step_profiler(config, s.run_dir) if s.is_chief else None
    log.start(p.step)
    try:
        while p.step < config.train.steps and not STOP.agreed():
            with tracker.measure("data_wait"):
                batch, p.data_states = prefetch.next()
            trial = next((t for t in p.trials if not t.done), None)
            if trial is not None:
                trial.before_step()
                p.trial_steps += 1
            t = time.perf_counter()
            train_step = p.train_steps[p.matmul_backend]
            # A capture starting at this step saves the step's HLO first (FLOPs, roofline and
            # memory for `jaxstack-prof report`).
            window = profiler.step(p.step, executable=train_step) if profiler else nullcontext()
            with window:
                p.state, device_metrics = train_step(p.state, batch)
                metrics = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
            dt = time.perf_counter() - t
            tracker.add("step", dt)
            if trial is not None:
                trial.after_step(dt)
                if trial.done:
                    _settle(trial, s, p)
                    log.info(trial.describe())
            p.step += 1
            notes = len(s.notes)
            metrics.update(s.speed(dt, tokens_per_step))
            for note in s.notes[notes:]:
                log.info(f"WARNING: {note}")
            metrics["goodput"] = tracker.summary()["goodput"]
            p.history.append(metrics)
            log.train(p.step, metrics)
            if not math.isfinite(metrics["loss"]):
                log.info(f"loss is {metrics['loss']} at step {p.step}; stopping (state not saved)")
                p.diverged = True
                return
            every = config.eval.every
            if every and p.step % every == 0 and p.step < config.train.steps:
                with tracker.measure("eval"):
                    p.eval_metrics = s.evaluate(eval_step, p.state["params"])
                log.eval(p.step, p.eval_metrics)
            if s.manager is not None and p.step % config.checkpoint.every == 0:
                with tracker.measure("checkpoint"):
                    s.save(p.step, p.state, p.data_states, metrics)
                p.last_saved = p.step
            for cb in callbacks:
                cb(p.step, p.state, metrics)
    finally:
        prefetch.close()
        if profiler:
            profiler.close()


def _stop(
    config: Config, s: Session, log: MetricsLog, tracker: GoodputTracker, p: _Progress
) -> TrainResult:
    """After a stop signal: save the step reached (if checkpointing), wait for it, return."""
    saved = False
    if s.manager is not None and config.checkpoint.on_preemption and not p.diverged:
        with tracker.measure("checkpoint"):
            if p.last_saved != p.step:
                s.save(p.step, p.state, p.data_states, p.history[-1] if p.history else {})
                p.last_saved = p.step
            s.manager.wait()
        saved = p.last_saved == p.step
    log.info(
        f"{STOP.name}: stopping at step {p.step}"
        + (f"; checkpoint of step {p.step} saved" if saved else "; nothing saved")
    )
    summary = _summary(config, s, tracker, p)
    summary["stopped"] = STOP.name
    log.summary(p.step, summary)
    return TrainResult(
        s.run_dir,
        p.step,
        summary,
        p.eval_metrics,
        None,
        p.state,
        stopped=STOP.name,
        stop_signal=STOP.signum,
        saved_on_stop=saved,
    )


def _summary(config: Config, s: Session, tracker: GoodputTracker, p: _Progress) -> dict[str, Any]:
    history, eval_metrics, step = p.history, p.eval_metrics, p.step
    # The first steps after compile are often slower (allocations, caches), and the trials'
    # steps run half under the slower setting; report the steady state after them.
    steady = history[min(len(history) - 1, max(p.trial_steps, 2)) :] if history else []
    out: dict[str, Any] = {"final_step": step}
    if history:
        out["first_loss"] = history[0]["loss"]
        out["final_loss"] = history[-1]["loss"]
        for key in ("tokens_per_sec", "step_time_s", "mfu"):
            out[f"median_{key}"] = statistics.median(m[key] for m in steady)
    if eval_metrics:
        out.update(eval_metrics)
    out["peak_flops_per_device"] = s.total_peak_flops / s.peak_units
    out["peak_source"] = s.peak_source
    out["flops_per_token"] = s.flops_per_token
    out["num_params"] = s.num_params
    out["mesh"] = "x".join(str(v) for v in s.mesh_sizes.values())
    out["host_allocator"] = p.host_allocator
    out["matmul_backend"] = p.matmul_backend
    for trial in p.trials:
        if trial.done:
            out[f"{trial.name.replace(' ', '_')}_trial_step_s"] = trial.step_times
    out.update(tracker.summary())
    return out


# The trial takes 12 steps, half of them under the slower setting (at most ~5% of a 40-step run).
ALLOCATOR_TRIAL_MIN_STEPS = 40


def _trials(allocator_trial: HostAllocatorTrial | None, p: _Progress) -> list[SettingTrial]:
    """The host-allocator trial, then the matmul-backend trial when there are two to time."""
    trials = [allocator_trial] if allocator_trial is not None else []
    if len(p.train_steps) > 1:
        trials.append(
            matmul_backend.trial(p.train_steps, lambda b: setattr(p, "matmul_backend", b))
        )
    return trials


def _settle(trial: SettingTrial, s: Session, p: _Progress) -> None:
    """Keeps a finished trial's choice: the allocator setting, or the train step it timed."""
    if isinstance(trial, HostAllocatorTrial):
        p.host_allocator = trial.choice
    else:
        p.train_steps = {trial.choice: p.train_steps[trial.choice]}  # frees the other
        s.matmul_backend = trial.choice  # checkpoints record it from here


def _host_allocator(config: Config) -> tuple[HostAllocatorTrial | None, str]:
    """The allocator trial for `auto` in a run long enough to pay for it, else the setting.

    Returns the trial (None without one) and the setting in force until it decides. Called
    before JAX starts its threads (see xprof-lite's HostAllocatorTrial).
    """
    if config.train.host_allocator == "auto" and config.train.steps >= ALLOCATOR_TRIAL_MIN_STEPS:
        trial = HostAllocatorTrial()
        return (None, trial.choice) if trial.done else (trial, "system")
    return None, set_host_allocator(config.train.host_allocator)


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
