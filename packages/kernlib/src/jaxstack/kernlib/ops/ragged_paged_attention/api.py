"""`ragged_paged_attention`: the public function, and the op's table of implementations."""

from __future__ import annotations

from jaxstack.kernlib._src import dispatch
from jaxstack.kernlib.ops.ragged_paged_attention import (
    base,
    ffi_cpu,
    pallas_mosaic_tpu,
    pallas_triton,
    xla,
)

OP = dispatch.Op.from_modules(
    "ragged_paged_attention", base, xla, pallas_triton, pallas_mosaic_tpu, ffi_cpu
)


@dispatch.public
def ragged_paged_attention(
    q,
    k_pages,
    v_pages,
    kv_lens,
    block_tables,
    query_start_loc,
    num_seqs=None,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    kv_layout: str = "page_major",
    implementation: str | None = None,
    config=None,
    interpret: bool = False,
):
    """Causal attention of mixed prefill chunks and decodes against a paged KV cache.

    Args:
      q: [T, Hq, D] new tokens of all sequences, concatenated by `query_start_loc`.
      k_pages, v_pages: the cache (already holding the new tokens), [num_pages, page_size,
        Hkv, D] with kv_layout="page_major" (the default) or [Hkv, num_pages, page_size, D]
        with kv_layout="head_major".
      kv_lens: int [S] cached tokens per sequence (including the new ones).
      block_tables: int [S, pages_per_seq] page ids per sequence (entries past the last used
        page are ignored, so -1 holes are fine).
      query_start_loc: int [S + 1] cumulative query rows (row offsets of each sequence in q).
      num_seqs: optional int scalar: live sequences; the rest are padding (output 0).
      scale, sliding_window, logits_soft_cap: as for `attention`.
      kv_layout: "page_major" or "head_major" (the XLA implementation and the CPU custom
        call only: the Pallas kernels read page-major; for XLA, head-major saves a transposed
        copy of every page read).
      implementation, config, interpret: as for `attention`. On CPU the default is the XLA
        FFI custom call `ffi_cpu` (C++ built for this CPU at first use, reading the pages in
        place), or `xla` where no C++ compiler is found (the log line says why).

    Returns:
      [T, Hq, D]; padding rows are 0.

    Example:
      >>> out = ragged_paged_attention(q, k_pages, v_pages, kv_lens, block_tables, cu_q_lens)
    """
    base.validate(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, kv_layout)
    options = dict(
        scale=scale,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        kv_layout=kv_layout,
    )
    arrays = (q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs)
    return dispatch.Call(OP, arrays, options, implementation, config, interpret)
