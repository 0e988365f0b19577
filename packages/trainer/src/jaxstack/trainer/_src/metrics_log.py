"""Where metrics go: JSON lines (always), TensorBoard event files, and the console.

`metrics.jsonl` gets one object per training step (`{"kind": "train", "step": ..., "loss": ...}`),
one per evaluation (`"kind": "eval"`) and a final `"kind": "summary"`; it is the record the HTML
report and tests read. TensorBoard files are written with tensorboardX under `tb/`. On a terminal
the console shows a rich progress bar carrying the latest loss and throughput; otherwise (CI,
pipes, log files) it prints one plain line every `log.every` steps.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
from typing import Any

CONSOLE_KEYS = (
    ("loss", "loss {:.4f}"),
    ("learning_rate", "lr {:.2e}"),
    ("grad_norm", "gnorm {:.3f}"),
    ("tokens_per_sec", "{:,.0f} tok/s"),
    ("step_time_s", "step {:.3f}s"),
    ("mfu", "mfu {:.1%}"),
)


class MetricsLog:
    """Writes metrics to `run_dir/metrics.jsonl`, TensorBoard and the console."""

    def __init__(
        self,
        run_dir: pathlib.Path,
        *,
        total_steps: int,
        every: int = 10,
        tensorboard: bool = True,
        progress: str = "auto",
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled  # False on non-zero processes of a multi-host run
        self.every = every
        self.total_steps = total_steps
        self._jsonl = None
        self._tb = None
        self._progress = None
        self._task = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tb"), flush_secs=10)
        use_rich = progress == "rich" or (progress == "auto" and sys.stdout.isatty())
        if use_rich:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
            )

    def start(self, first_step: int) -> None:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total_steps, completed=first_step)

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None and self._progress.live.is_started:
            self._progress.console.print(message)
        else:
            print(message, flush=True)

    def train(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._write("train", step, metrics)
        text = "  ".join(
            fmt.format(metrics[k])
            for k, fmt in CONSOLE_KEYS
            if k in metrics and math.isfinite(metrics[k])
        )
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step, description=text)
        elif step % self.every == 0 or step == self.total_steps or step == 1:
            print(f"step {step:>6}/{self.total_steps}  {text}", flush=True)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._write("eval", step, metrics)
        self.info(
            f"eval  step {step}: loss {metrics['eval_loss']:.4f}  "
            f"perplexity {metrics['eval_perplexity']:.2f}"
        )

    def summary(self, step: int, metrics: dict[str, Any]) -> None:
        if self.enabled:
            self._write("summary", step, metrics)

    def _write(self, kind: str, step: int, metrics: dict[str, Any]) -> None:
        record = {"kind": kind, "step": step, **metrics}
        self._jsonl.write(json.dumps(record, default=float) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self._progress is not None and self._progress.live.is_started:
            self._progress.stop()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl file (resumed runs append; later records win per step)."""
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line]
