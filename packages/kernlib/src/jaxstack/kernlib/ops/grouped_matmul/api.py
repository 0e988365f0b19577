"""`grouped_matmul`: the public function, and the op's table of implementations."""

from __future__ import annotations

from jaxstack.kernlib._src import dispatch
from jaxstack.kernlib.ops.grouped_matmul import base, pallas_mosaic_tpu, pallas_triton, xla

OP = dispatch.Op.from_modules("grouped_matmul", base, xla, pallas_triton, pallas_mosaic_tpu)


@dispatch.public
def grouped_matmul(
    lhs,
    rhs,
    group_sizes,
    *,
    preferred_element_type=None,
    implementation: str | None = None,
    config=None,
    interpret: bool = False,
):
    """Ragged dot for MoE experts: rows of `lhs` sorted by group, group g times `rhs[g]`.

    Same contract as `jax.lax.ragged_dot`: rows past `sum(group_sizes)` are zero.
    Differentiable in lhs and rhs.

    Args:
      lhs: [M, K] tokens sorted by expert. rhs: [G, K, N] expert weights.
      group_sizes: int [G] rows per group (may be 0; sum <= M).
      preferred_element_type: output dtype (default: promoted input dtype).
      implementation, config, interpret: as for `attention`.

    Example:
      >>> hidden = grouped_matmul(sorted_tokens, w_up, tokens_per_expert)
    """
    base.validate(lhs, rhs, group_sizes)
    options = dict(preferred_element_type=preferred_element_type)
    return dispatch.Call(OP, (lhs, rhs, group_sizes), options, implementation, config, interpret)
