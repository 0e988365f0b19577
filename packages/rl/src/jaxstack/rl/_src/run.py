"""One post-training run: its directory, checkpoints, metrics and the step loop.

    restore (or start) -> for each step: step_fn, log, checkpoint every N -> final checkpoint,
                          summary, HTML report

Every algorithm supplies only `step_fn(state, step) -> (state, metrics)` and, when its data
position is not a function of the step, a `data_state()`; so SFT, DPO, ORPO, GRPO and PPO share
one loop with one resume path. A run directory holds `config.yaml`, `metrics.jsonl`, `tb/`,
`checkpoints/` (ckptlib) and `report.html`. Determinism: randomness is derived from
`train.seed` and the step number, so a run killed and resumed from step k repeats exactly the
steps an uninterrupted run takes.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import pathlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.rl._src.config import RLConfig

# What each algorithm adds to the trainer's console line (loss, lr, gnorm, tok/s, step time),
# under TRL's metric names; GRPO and PPO also show each reward function's mean and std.
CONSOLE_KEYS = {
    "dpo": (
        ("rewards/chosen", "chosen {:+.4f}"),
        ("rewards/rejected", "rejected {:+.4f}"),
        ("rewards/margins", "margin {:+.4f}"),
        ("rewards/accuracies", "acc {:.0%}"),
    ),
    "orpo": (
        ("nll_loss", "nll {:.4f}"),
        ("log_odds_ratio", "log-odds {:+.3f}"),
        ("rewards/margins", "margin {:+.4f}"),
        ("rewards/accuracies", "acc {:.0%}"),
    ),
    "grpo": (
        ("reward", "reward {:.3f}"),
        ("reward_std", "std {:.3f}"),
        ("kl", "kl {:.4f}"),
        ("completions/mean_length", "len {:.1f}"),
        ("completions/clipped_ratio", "cut {:.0%}"),
        ("clip_ratio", "clip {:.1%}"),
    ),
    "ppo": (
        ("reward", "reward {:.3f}"),
        ("reward_std", "std {:.3f}"),
        ("kl", "kl {:.4f}"),
        ("completions/mean_length", "len {:.1f}"),
        ("clip_ratio", "clip {:.1%}"),
        ("value_loss", "vloss {:.4f}"),
    ),
}


def console_line(algorithm: str, metrics: dict[str, float]) -> str:
    """The algorithm's own metrics of a step as one line ("" when it has none)."""
    parts = [
        fmt.format(metrics[k])
        for k, fmt in CONSOLE_KEYS.get(algorithm, ())
        if k in metrics and math.isfinite(metrics[k])
    ]
    for key, value in metrics.items():
        if key.startswith("rewards/") and key.endswith("/mean") and math.isfinite(value):
            name = key.removeprefix("rewards/").removesuffix("/mean")
            std = metrics.get(f"rewards/{name}/std", math.nan)
            parts.append(f"{name} {value:.3f}±{std:.3f}")
    return "  ".join(parts)


StepFn = Callable[[dict[str, Any], int], tuple[dict[str, Any], dict[str, float]]]
StopFn = Callable[[int, dict[str, float]], bool]
# evaluate(step, generate) -> metrics, with generate(prompts) -> greedy completions
Evaluate = Callable[[int, Callable[[Sequence[str]], list[str]]], dict[str, float]]


@dataclasses.dataclass
class RunResult:
    """Where a run lives, how far it got, its summary and final training state."""

    run_dir: pathlib.Path
    step: int
    summary: dict[str, Any]
    state: dict[str, Any]


def default_run_dir(algorithm: str) -> pathlib.Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return pathlib.Path.cwd() / "runs" / f"{algorithm}-{stamp}"


def optimizer(config: RLConfig, params: Any) -> Any:
    """optlib's optimiser for the trainable params; a schedule spans train.steps by default."""
    from jaxstack import optlib

    return optlib.build_optimizer(config.optimizer, params)


def initial_state(params: Any, tx: Any) -> dict[str, Any]:
    """`{"params", "opt_state", "step"}` on copies of `params` (train steps donate the state,
    and the starting params stay in use as the reference policy)."""
    params = jax.tree.map(jnp.copy, params)
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}


def prepare_host(config: RLConfig) -> str:
    """Applies the trainer's host settings to this process; returns the host allocator in force.

    - `train.xla_flags` join `XLA_FLAGS` (XLA reads them when JAX starts its backend: in a
      process that has computed already, as the second stage of a recipe, they come too late);
    - `train.compile_cache` turns on JAX's persistent compilation cache;
    - `train.host_allocator`: XLA:CPU mallocs each step's temporaries, and under glibc's own
      rules a tiny GRPO iteration paged ~9,000 freshly zeroed pages back in ("retain" keeps
      them: docs/rl.md). "auto" is the CPU flags' guess here (the trainer's loop times both
      instead). Threads that have malloc'd keep their own arenas, so each algorithm calls this
      before its first JAX computation.
    """
    from jaxstack import trainer
    from jaxstack.xprof_lite import set_host_allocator

    trainer.add_xla_flags(config.train.xla_flags)
    trainer.enable_compile_cache(config.train.compile_cache)
    return set_host_allocator(config.train.host_allocator)


class Run:
    """Run directory, ckptlib checkpoints (with preemption), JSONL/TensorBoard metrics."""

    def __init__(self, config: RLConfig, allocator: str):
        """`allocator`: the host allocator the algorithm applied at its start (`host_allocator`),
        recorded in the summary."""
        from jaxstack import ckptlib
        from jaxstack.trainer import MetricsLog

        self.config = config
        base = config.base
        self.host_allocator = allocator
        self.dir = pathlib.Path(base.log.run_dir or default_run_dir(config.algorithm))
        self.dir.mkdir(parents=True, exist_ok=True)
        config.save(self.dir / "config.yaml")
        self.manager = None
        self.preemption = None
        if base.checkpoint.enabled:
            self.manager = ckptlib.CheckpointManager(
                self.dir / "checkpoints",
                max_to_keep=base.checkpoint.max_to_keep,
                async_save=base.checkpoint.async_save,
            )
            if base.checkpoint.on_preemption:
                self.preemption = ckptlib.PreemptionHandler().install()
        self.log = MetricsLog(
            self.dir,
            total_steps=base.train.steps,
            every=base.log.every,
            tensorboard=base.log.tensorboard,
            progress=base.log.progress,
        )

    def restore(self, state: dict[str, Any]) -> tuple[int, dict[str, Any], Any]:
        """(start step, state, data state): the latest checkpoint's when resuming, else
        (0, `state`, None)."""
        if self.manager is None or not self.config.base.checkpoint.resume:
            return 0, state, None
        if self.manager.latest_step() is None:
            return 0, state, None
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), state)
        restored = self.manager.restore(target=target)
        self.log.info(f"resumed from step {restored.step} in {self.dir / 'checkpoints'}")
        return int(restored.step), restored.state, restored.data_state

    def loop(
        self,
        state: dict[str, Any],
        step_fn: StepFn,
        *,
        start: int = 0,
        data_state: Callable[[], Any] | None = None,
        stop: StopFn | None = None,
    ) -> RunResult:
        """Runs steps `start + 1 .. train.steps`, checkpointing every `checkpoint.every`; a
        step after which `stop(step, metrics)` is true is saved and ends the run early."""
        total, every = self.config.base.train.steps, self.config.base.checkpoint.every
        history: list[dict[str, float]] = []
        step, saved = start, start
        self.log.start(start)
        wall = time.perf_counter()
        while step < total:
            t = time.perf_counter()
            state, metrics = step_fn(state, step)
            metrics["step_time_s"] = time.perf_counter() - t
            if "tokens" in metrics:  # model rows x length the step processed
                metrics["tokens_per_sec"] = metrics.pop("tokens") / metrics["step_time_s"]
            step += 1
            history.append(metrics)
            self.log.train(step, metrics)
            self._console(step, metrics)
            preempted = self.preemption is not None and self.preemption.requested
            stopped = stop is not None and stop(step, metrics)
            end = step == total or preempted or stopped
            if self.manager is not None and (step % every == 0 or end):
                self._save(step, state, data_state, metrics)
                saved = step
            if preempted:
                self.log.info(f"preemption requested: saved step {step} and stopping")
                break
            if stopped:
                self.log.info(f"stop condition met after step {step}")
                break
        if self.manager is not None and saved != step:
            self._save(step, state, data_state, history[-1] if history else {})
        summary = self._summary(step, history, time.perf_counter() - wall)
        return RunResult(self.dir, step, summary, state)

    def _console(self, step: int, metrics: dict[str, float]) -> None:
        """The algorithm's metrics under the trainer's line, on the trainer's cadence."""
        total, every = self.config.base.train.steps, self.config.base.log.every
        if not (step % every == 0 or step == total or step == 1):
            return
        line = console_line(self.config.algorithm, metrics)
        if line:
            self.log.info(f"{'':16}{line}")  # under the trainer's "step N/T  " columns

    def evaluation_due(self, step: int) -> bool:
        """Whether the step numbered `step` (1-based) is followed by an evaluation: every
        `eval.every` steps and after the last."""
        every = self.config.base.eval.every
        return (every > 0 and step % every == 0) or step == self.config.base.train.steps

    def _save(self, step: int, state: Any, data_state: Callable[[], Any] | None, metrics) -> None:
        self.manager.save(
            step,
            state,
            data_state=data_state() if data_state else None,
            metadata={"config": self.config.to_dict()},
            metrics={k: float(v) for k, v in metrics.items()},
        )

    def _summary(self, step: int, history: list[dict[str, float]], wall: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "final_step": step,
            "wall_s": wall,
            "host_allocator": self.host_allocator,
        }
        if history:
            out["first_loss"] = history[0]["loss"]
            out["final_loss"] = history[-1]["loss"]
            out["median_step_time_s"] = statistics.median(m["step_time_s"] for m in history)
        return out

    def finish(self, result: RunResult, extra: dict[str, Any] | None = None) -> None:
        """Final summary record, HTML report, and closing the checkpoint writer."""
        from jaxstack.trainer import write_report

        result.summary.update(extra or {})
        if self.manager is not None:
            self.manager.wait()
        self.log.summary(result.step, result.summary)
        if self.config.base.log.report:
            self.log.info(f"report: {write_report(self.dir)}")

    def close(self) -> None:
        self.log.close()
        if self.manager is not None:
            self.manager.close()
        if self.preemption is not None:
            self.preemption.uninstall()
