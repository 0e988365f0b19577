"""Damaged steps are moved aside, so a run that resumes past one can save that step again.

A committed step that fails its check (a truncated or missing file, a changed byte, an unreadable
manifest) would otherwise stay where it is: `latest_step` and `restore` skip it, and the run that
resumed from an older step dies with CheckpointExistsError when it reaches the damaged step
again, on every restart. Moving it to `damaged/` keeps it for inspection, frees its name, and is
said loudly, because a resume from an older step (or from scratch) loses work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxstack.ckptlib._src import layout
from jaxstack.ckptlib._src.manifest import VerificationResult


class CheckpointFallbackWarning(UserWarning):
    """restore() skipped a newer checkpoint that failed verification and used an older one."""


class CheckpointDamagedWarning(UserWarning):
    """Damaged checkpoints were found when a manager opened its directory and moved aside."""


@dataclasses.dataclass(frozen=True)
class DamagedCheckpoint:
    """A step that failed its check and was moved aside (see `CheckpointManager.damaged`).

    Attributes:
      step: the step.
      moved_to: where its directory is now (under `<directory>/damaged/`).
      problems: what the check found.
    """

    step: int
    moved_to: Path
    problems: tuple[str, ...]


def set_aside(directory: Path, step: int, result: VerificationResult) -> DamagedCheckpoint:
    return DamagedCheckpoint(step, layout.move_aside(directory, step), result.problems)


def summary(damaged: list[DamagedCheckpoint]) -> str:
    """`step 20 (state/d/ab12: 100 bytes, manifest says 200) moved to .../damaged/...; ...`"""
    return "; ".join(
        f"step {d.step} ({', '.join(d.problems) or 'damaged'}) moved to {d.moved_to}"
        for d in damaged
    )


def opening_message(directory: Path, damaged: list[DamagedCheckpoint], good_left: bool) -> str:
    outcome = (
        "older good checkpoints remain"
        if good_left
        else "no good checkpoint is left, so a run resuming here starts from scratch"
    )
    return (
        f"{len(damaged)} damaged checkpoint(s) in {directory} moved aside to "
        f"{directory / layout.DAMAGED_DIR}: {summary(damaged)}; {outcome}"
    )
