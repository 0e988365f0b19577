"""The XLA implementation: gather each token's pages, masked softmax (the reference)."""

from __future__ import annotations

from jaxstack.kernlib.ops.ragged_paged_attention import base


def run(
    q,
    k_pages,
    v_pages,
    kv_lens,
    block_tables,
    query_start_loc,
    num_seqs=None,
    *,
    config=None,
    interpret=False,
    **options,
):
    del config, interpret
    return base.reference(
        q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs, **options
    )
