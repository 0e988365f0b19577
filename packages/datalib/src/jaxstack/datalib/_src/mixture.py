"""Weighted mixtures of document sources, as one random-access Grain dataset.

Each source is shuffled (seed + its position) and repeated, so a small source with a large
weight is upsampled with a fresh order every pass, and Grain's `MapDataset.mix` interleaves them
in proportion to `weights`. The mixture is cut to `length` documents (default: the sources'
total), which is what `lm_batches` then treats as one epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxstack.datalib._src.errors import ConfigError, EmptySourceError
from jaxstack.datalib._src.nojax import grain


def mixture(
    sources: Sequence[Any],
    weights: Sequence[float],
    *,
    seed: int = 0,
    length: int | None = None,
) -> grain.MapDataset:
    """A MapDataset drawing from `sources` in proportion to `weights`.

    >>> mix = mixture([code_docs, prose_docs], [0.7, 0.3])
    >>> it = lm_batches(mix, seq_len=1024, batch_size=8)
    """
    if len(sources) != len(weights) or not sources:
        raise ConfigError(
            f"{len(sources)} sources and {len(weights)} weights; give one weight per source"
        )
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"weights={list(weights)}; use non-negative weights with a positive sum")
    parts = []
    for i, source in enumerate(sources):
        ds = source if isinstance(source, grain.MapDataset) else grain.MapDataset.source(source)
        if len(ds) == 0:
            raise EmptySourceError(f"mixture source {i} ({source!r}) holds no documents")
        parts.append(ds.shuffle(seed=(seed + i) % 2**32).repeat())
    total = sum(len(s) for s in sources) if length is None else length
    if total < 1:
        raise ConfigError(f"length={length}; use a positive number of documents")
    return grain.MapDataset.mix(parts, [float(w) for w in weights])[:total]
