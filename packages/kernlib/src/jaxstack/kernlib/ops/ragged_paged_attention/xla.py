"""The XLA implementation: gather each token's pages, masked softmax (the reference)."""

from __future__ import annotations

from jaxstack.kernlib.ops.ragged_paged_attention import base


def run(*arrays, config=None, interpret=False, **options):
    """`base.reference` on (q, k_pages, v_pages, kv_lens, block_tables, query_start_loc,
    num_seqs), the arrays in the order `api` passes them; it documents the arguments."""
    del config, interpret
    return base.reference(*arrays, **options)
