"""The XLA implementation: query tiles against their sequence's pages, a chunk at a time.

`base.reference` gathers every page of a token's block table for every token: [T, pages *
page_size, Hkv, D] per layer. With an HF model's 32k-position block tables and a 256-token
prefill that is gigabytes per step, nearly all of it pages no sequence holds. Here queries are
grouped into tiles of consecutive rows of one sequence (`base.tiles`, as the Pallas kernels do),
and a `while_loop` walks the block tables `chunk` pages at a time with an online softmax, only
as far as the longest live sequence reaches (from the first page a sliding window can see): the
work and the memory follow the tokens in the cache, not the block tables' width.

The matmuls batch over (tile, kv head). A page-major cache's gathered pages are [V, chunk,
page_size, Hkv, D]: the kv head sits between the positions and D, so XLA copies every
gathered key and value into [V, Hkv, positions, D] order before the matmul (on CPU, about half
of a small model's decode step). A head-major cache gathers as [Hkv, V, chunk, page_size, D],
a free reshape from [Hkv, V, positions, D]: the loop then runs with (kv head, tile) leading,
the queries and the softmax state transposed once outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxstack.kernlib.ops.attention import base as attention_base
from jaxstack.kernlib.ops.ragged_paged_attention import base

CHUNK_TOKENS = 256  # cache positions read per loop iteration (per tile), at most
CHUNK_BYTES = 2 << 20  # decode rows: keys (and as many values) gathered per loop iteration
BLOCK_Q = 16  # rows per prefill tile


def run(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs=None, **options):
    """The arguments are `base`'s (its module docstring documents them); `config` and
    `interpret` are not used."""
    st = base.static(q, k_pages, block_tables, **options)
    layout = options.get("kv_layout", base.PAGE_MAJOR)
    head_major = layout == base.HEAD_MAJOR
    num_pages, page_size, hkv, d = base.cache_dims(k_pages, layout)
    groups = query_groups(q, kv_lens, query_start_loc, num_seqs, page_size, st.window)
    chunk = chunk_pages(groups.q.shape[:2], hkv * d * k_pages.dtype.itemsize, page_size)
    # A chunk never spans more pages than a block table holds: with short sequences (RL
    # rollouts: one page each) a full CHUNK_TOKENS chunk would gather and mask mostly padding.
    chunk = min(chunk, block_tables.shape[1])
    width = -(-block_tables.shape[1] // chunk) * chunk
    tables = jnp.pad(block_tables, ((0, 0), (0, width - block_tables.shape[1])))
    q_tiles = groups.q.reshape(*groups.q.shape[:2], hkv, st.group, d)  # [V, bq, Hkv, g, D]
    if head_major:
        q_tiles = q_tiles.transpose(2, 0, 1, 3, 4)  # [Hkv, V, bq, g, D]
    seq_tables = tables[groups.seq]
    live = groups.last_page >= 0
    first = jnp.min(jnp.where(live, groups.first_page, width)) // chunk
    stop = (jnp.max(groups.last_page) + chunk) // chunk  # chunks up to the furthest page read
    q_pos, q_live = groups.pos[:, :, None], groups.live[:, :, None]
    n, positions = seq_tables.shape[0], chunk * page_size
    if head_major:
        qk, pv = "hvqgd,hvkd->hvqgk", "hvqgk,hvkd->hvqgd"
        gather = lambda cache, pages: cache[:, pages].reshape(hkv, n, positions, d)
        spread = lambda mask: mask[None, :, :, None, :]  # [V, bq, K] -> [1, V, bq, 1, K]
    else:
        qk, pv = "vqhgd,vkhd->vqhgk", "vqhgk,vkhd->vqhgd"
        gather = lambda cache, pages: cache[pages].reshape(n, positions, hkv, d)
        spread = lambda mask: mask[:, :, None, None, :]  # [V, bq, K] -> [V, bq, 1, 1, K]

    def body(c, carry):
        row_max, denom, acc = carry
        pages = jax.lax.dynamic_slice_in_dim(seq_tables, c * chunk, chunk, axis=1)
        pages = jnp.clip(pages, 0, num_pages - 1)  # holes are masked below, never used
        keys, values = gather(k_pages, pages), gather(v_pages, pages)
        logits = jnp.einsum(qk, q_tiles, keys, preferred_element_type=jnp.float32)
        logits = attention_base.soft_cap(logits * st.scale, st.cap)
        k_pos = c * positions + jnp.arange(positions, dtype=jnp.int32)
        mask = (k_pos <= q_pos) & q_live
        if st.window is not None:
            mask &= q_pos - k_pos < st.window
        mask = spread(mask)
        masked = jnp.where(mask, logits, attention_base.MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(masked, axis=-1, keepdims=True))
        unnorm = jnp.where(mask, jnp.exp(masked - new_max), 0.0)
        rescale = jnp.exp(row_max - new_max)
        denom = denom * rescale + jnp.sum(unnorm, axis=-1, keepdims=True)
        acc = acc * rescale + jnp.einsum(
            pv, unnorm.astype(values.dtype), values, preferred_element_type=jnp.float32
        )
        return new_max, denom, acc

    stats = (*q_tiles.shape[:-1], 1)
    init = (
        jnp.full(stats, attention_base.MASK_VALUE, jnp.float32),
        jnp.zeros(stats, jnp.float32),
        jnp.zeros(q_tiles.shape, jnp.float32),
    )
    _, denom, acc = jax.lax.fori_loop(first, stop, body, init)
    out = acc / jnp.where(denom == 0.0, 1.0, denom)
    if head_major:
        out = out.transpose(1, 2, 0, 3, 4)  # [V, bq, Hkv, g, D]
    return groups.to_rows(out.reshape(*groups.q.shape)).astype(q.dtype)


def chunk_pages(group_shape: tuple[int, int], position_bytes: int, page_size: int) -> int:
    """Pages a loop iteration reads: CHUNK_TOKENS positions, halved for decode rows (one query
    row per group) while their gathered keys exceed CHUNK_BYTES. XLA materialises every gather;
    a chunk that outgrows the core's cache is written to memory and read back by the matmul (a
    32-row decode step of 4 kv heads of 64 floats gathers 8 MiB per layer at 256 positions,
    2 MiB at 64: benchmarks/serving-llm/README.md, "Attention chunks by bytes"). Prefill tiles
    keep the full chunk: their 16 query rows share each gathered page."""
    groups, rows = group_shape
    positions = CHUNK_TOKENS
    while rows == 1 and positions > page_size and groups * positions * position_bytes > CHUNK_BYTES:
        positions //= 2
    return max(1, positions // page_size)


class QueryGroups(NamedTuple):
    """Query rows grouped by sequence: V groups of bq rows, each group one sequence's."""

    q: jax.Array  # [V, bq, Hq, D]
    seq: jax.Array  # [V] the group's sequence
    pos: jax.Array  # [V, bq] position of each row
    live: jax.Array  # [V, bq] rows that are real tokens
    first_page: jax.Array  # [V] first page a row can see (sliding window), else 0
    last_page: jax.Array  # [V] last page a row can see; -1 for an empty group
    to_rows: Callable[[jax.Array], jax.Array]  # [V, bq, Hq, D] -> [T, Hq, D]


def query_groups(q, kv_lens, query_start_loc, num_seqs, page_size: int, window) -> QueryGroups:
    """One row per group when the rows are mostly decodes (no padding rows to compute), tiles
    of BLOCK_Q rows of one sequence (`base.tiles`) when prefill chunks make up the batch."""
    t = q.shape[0]
    if t <= 2 * kv_lens.shape[0]:
        r = base.token_rows(kv_lens, query_start_loc, num_seqs, t)
        last = jnp.where(r.active, r.pos // page_size, -1)
        first = jnp.zeros_like(last)
        if window is not None:
            first = jnp.maximum(0, r.pos - (window - 1)) // page_size
        return QueryGroups(
            q[:, None], r.seq, r.pos[:, None], r.active[:, None], first, last,
            lambda out: jnp.where(r.active[:, None, None], out[:, 0], 0),
        )  # fmt: skip
    tl = base.tiles(kv_lens, query_start_loc, num_seqs, t, BLOCK_Q, page_size, window)
    rows = jnp.arange(BLOCK_Q, dtype=jnp.int32)[None, :]
    return QueryGroups(
        base.gather_tiles(q, tl), tl.seq, tl.pos0[:, None] + rows, rows < tl.rows[:, None],
        tl.first_page, tl.last_page, lambda out: base.scatter_tiles(out, tl),
    )  # fmt: skip
