"""Measures of a pipeline's output that users and the CLI report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np


def packing_efficiency(batches: Iterable[Mapping[str, np.ndarray]]) -> float:
    """Fraction of non-padding positions (segment_ids > 0) over all given batches."""
    real = total = 0
    for batch in batches:
        segment_ids = np.asarray(batch["segment_ids"])
        real += int(np.count_nonzero(segment_ids))
        total += segment_ids.size
    if total == 0:
        raise ValueError("packing_efficiency needs at least one batch")
    return real / total
