"""Which good checkpoints to keep (a pure function of the steps, their metrics and the policy),
and the deletion of the others."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from pathlib import Path

from jaxstack.ckptlib._src import layout, manifest


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """Keep the union of: the last `max_to_keep` steps, every step divisible by
    `keep_every_n_steps`, and the `best_n` best steps by `best_metric` (`best_mode` "min"/"max").

    With neither `max_to_keep` nor `best_n` set, nothing is ever deleted. The newest good step is
    always kept, whatever the policy says, so a run can always resume and the only good
    checkpoint is never deleted.
    """

    max_to_keep: int | None = None
    keep_every_n_steps: int | None = None
    best_n: int | None = None
    best_metric: str | None = None
    best_mode: str = "min"

    def __post_init__(self) -> None:
        for name in ("max_to_keep", "keep_every_n_steps", "best_n"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r}: use a positive int or None")
        if self.best_n is not None and not self.best_metric:
            raise ValueError(f"best_n={self.best_n} needs best_metric (the metric to rank by)")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode={self.best_mode!r}: use 'min' or 'max'")

    @property
    def deletes_anything(self) -> bool:
        return self.max_to_keep is not None or self.best_n is not None


def steps_to_keep(
    good_steps: list[int], metrics: Mapping[int, Mapping[str, float]], policy: RetentionPolicy
) -> set[int]:
    """The subset of `good_steps` the policy keeps (never empty when `good_steps` is not)."""
    steps = sorted(good_steps)
    if not steps or not policy.deletes_anything:
        return set(steps)
    keep = {steps[-1]}
    if policy.max_to_keep is not None:
        keep.update(steps[-policy.max_to_keep :])
    if policy.keep_every_n_steps is not None:
        keep.update(s for s in steps if s % policy.keep_every_n_steps == 0)
    if policy.best_n is not None:
        ranked = [
            s
            for s in steps
            if isinstance(v := metrics.get(s, {}).get(policy.best_metric), int | float)
            and math.isfinite(v)
        ]
        sign = 1.0 if policy.best_mode == "min" else -1.0
        # Ties go to the newer step.
        ranked.sort(key=lambda s: (sign * metrics[s][policy.best_metric], -s))
        keep.update(ranked[: policy.best_n])
    return keep


def delete_dropped(directory: Path, good_steps: list[int], policy: RetentionPolicy) -> None:
    """Delete the good steps the policy drops; a failure is logged (the new step stays)."""
    if not policy.deletes_anything:
        return
    try:
        metrics = {s: manifest.load(layout.step_dir(directory, s))["metrics"] for s in good_steps}
        keep = steps_to_keep(good_steps, metrics, policy)
        for s in good_steps:
            if s not in keep:
                layout.remove_tree(layout.step_dir(directory, s))
    except OSError as e:
        logging.getLogger("jaxstack.ckptlib").warning("retention in %s failed: %s", directory, e)
