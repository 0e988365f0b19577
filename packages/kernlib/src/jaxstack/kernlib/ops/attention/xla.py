"""The XLA implementation: the reference itself (runs everywhere, differentiable by JAX)."""

from __future__ import annotations

from jaxstack.kernlib.ops.attention import base


def run(q, k, v, segment_ids=None, *, config=None, interpret=False, **options):
    del config, interpret
    return base.reference(q, k, v, segment_ids, **options)
