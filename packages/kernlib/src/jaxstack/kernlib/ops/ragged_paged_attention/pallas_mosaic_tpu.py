"""Ragged paged attention in Pallas Mosaic (TPU), driven by scalar-prefetched block tables.

Queries are cut into tiles of block_q rows of one sequence (an XLA gather) and laid out
[tile, block_q, Hq * D]; the cache is viewed as [num_pages, page_size, Hkv * D] (a free
reshape), so each grid step (tile, page slot) DMAs one whole page, all kv heads, whose id the
index map reads from the prefetched block table. Slots outside the tile's visible pages clamp
to a page already resident (no DMA) and skip compute. Heads are lane slices of D at static
offsets; per-head running max / sum / accumulator live in VMEM scratch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxstack.kernlib._src.config import KernelConfig, multiple_of
from jaxstack.kernlib.ops.attention import base as attention_base
from jaxstack.kernlib.ops.ragged_paged_attention import base

LANES = 128
NT = (((1,), (1,)), ((), ()))


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_q: int = multiple_of(8, 8)
    SWEEP = ((16,), (32,), (64,), (128,))


def _kernel(
    seq,
    pos0,
    first,
    last,
    bt,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_ref,
    l_ref,
    acc_ref,
    *,
    st: base.Static,
):
    tile, j = pl.program_id(0), pl.program_id(1)
    d, ps, g = st.head_dim, st.page_size, st.group
    bq = q_ref.shape[0]

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, attention_base.MASK_VALUE, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(jnp.logical_and(j >= first[tile], j <= last[tile]))
    def _step():
        shape = (bq, ps)
        q_pos = pos0[tile] + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
        k_pos = j * ps + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
        mask = k_pos <= q_pos
        if st.window is not None:
            mask = jnp.logical_and(mask, q_pos - k_pos < st.window)
        for kvh in range(st.kv_heads):
            k = k_ref[:, kvh * d : (kvh + 1) * d]
            v = v_ref[:, kvh * d : (kvh + 1) * d]
            for h in range(kvh * g, (kvh + 1) * g):
                q = q_ref[:, h * d : (h + 1) * d]
                s = jax.lax.dot_general(q, k, NT, preferred_element_type=jnp.float32)
                s = s * st.scale
                if st.cap is not None:
                    s = st.cap * jnp.tanh(s / st.cap)
                s = jnp.where(mask, s, attention_base.MASK_VALUE)
                m_prev = m_ref[h]
                m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
                alpha = jnp.exp(m_prev - m_new)
                p = jnp.where(mask, jnp.exp(s - m_new[:, :1]), 0.0)
                l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=1, keepdims=True)
                m_ref[h] = m_new
                pv = jax.lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
                acc_ref[h] = alpha[:, :1] * acc_ref[h] + pv

    @pl.when(j == st.pages_per_seq - 1)
    def _finish():
        for h in range(st.heads):
            row_sum = l_ref[h][:, :1]
            o_ref[:, h * d : (h + 1) * d] = (
                acc_ref[h] / jnp.where(row_sum == 0.0, 1.0, row_sum)
            ).astype(o_ref.dtype)


def check(q, k_pages, *args, **options) -> str | None:
    if reason := base.layout_unsupported(options):
        return reason
    if k_pages.shape[1] % 8:
        return f"page_size {k_pages.shape[1]} is not a multiple of 8 (TPU sublanes)"
    return base.dtype_mismatch(q, k_pages)


def run(q, k_pages, v_pages, *batch, config: Config, **options):
    """The arguments are `base`'s (`batch`: kv_lens, block_tables, query_start_loc, num_seqs);
    the cache is viewed as [num_pages, page_size, Hkv * D], so a grid step DMAs a whole page."""
    st, tl, q_tiles, block_tables = base.prepare(
        q, k_pages, *batch, block_q=config.block_q, **options
    )
    n_tiles, bq, hq, d = q_tiles.shape
    num_pages, ps, hkv, _ = k_pages.shape
    pages_per_seq = st.pages_per_seq
    q_tiles = q_tiles.reshape(n_tiles, bq, hq * d)
    bt_flat = block_tables.reshape(-1)

    def page_map(i, j, seq, pos0, first, last, bt):
        slot = jnp.clip(j, first[i], jnp.maximum(last[i], first[i]))
        return bt[seq[i] * pages_per_seq + slot], 0, 0

    row = pl.BlockSpec((None, bq, hq * d), lambda i, j, *_: (i, 0, 0))
    page = pl.BlockSpec((None, ps, hkv * d), page_map)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(n_tiles, pages_per_seq),
        in_specs=[row, page, page],
        out_specs=row,
        scratch_shapes=[
            pltpu.VMEM((hq, bq, LANES), jnp.float32),
            pltpu.VMEM((hq, bq, LANES), jnp.float32),
            pltpu.VMEM((hq, bq, d), jnp.float32),
        ],
    )
    out = pl.pallas_call(
        functools.partial(_kernel, st=st),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q_tiles.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=st.interpret,
        name="kernlib_ragged_paged_attention",
    )(
        tl.seq,
        tl.pos0,
        tl.first_page,
        tl.last_page,
        bt_flat,
        q_tiles,
        k_pages.reshape(num_pages, ps, hkv * d),
        v_pages.reshape(num_pages, ps, hkv * d),
    )
    return base.scatter_tiles(out.reshape(n_tiles, bq, hq, d), tl)
