"""Ragged paged attention in Pallas Triton.

The ragged queries are first cut into tiles of block_q rows of one sequence each (an XLA
gather); the kernel then runs on grid (tile, query head). A program walks only the pages its
rows can see (block-table lookups are scalar loads), reading each page's [page_size, D] slab
for its kv head straight from the cache and keeping an online softmax in registers. Decodes
use one row of a tile; prefill chunks fill whole tiles.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxstack.kernlib._src.config import KernelConfig, power_of_two
from jaxstack.kernlib.ops.attention import base as attention_base
from jaxstack.kernlib.ops.ragged_paged_attention import base

LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class Config(KernelConfig):
    block_q: int = power_of_two(16, 16)
    num_warps: int = 4
    num_stages: int = 2
    SWEEP = ((16, 4, 3), (16, 8, 2), (32, 4, 2), (64, 4, 2))


def _kernel(
    seq_ref, pos_ref, first_ref, last_ref, bt_ref, q_ref, k_ref, v_ref, o_ref, *, st: base.Static
):
    tile, head = pl.program_id(0), pl.program_id(1)
    kv_head = head // st.group
    seq, pos0 = seq_ref[tile], pos_ref[tile]
    bq, ps = q_ref.shape[0], st.page_size
    q = q_ref[...]
    q_pos = pos0 + jnp.arange(bq, dtype=jnp.int32)

    def body(j, carry):
        acc, m, row_sum = carry
        page = bt_ref[seq, j]
        k = k_ref[page, :, kv_head, :]
        v = v_ref[page, :, kv_head, :]
        s = plgpu.dot(q, k, trans_b=True) * st.scale
        if st.cap is not None:
            s = st.cap * jnp.tanh(s / st.cap)
        s = s * LOG2E
        k_pos = j * ps + jnp.arange(ps, dtype=jnp.int32)
        mask = k_pos[None, :] <= q_pos[:, None]
        if st.window is not None:
            mask = jnp.logical_and(mask, q_pos[:, None] - k_pos[None, :] < st.window)
        s = jnp.where(mask, s, attention_base.MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.where(mask, jnp.exp2(s - m_new[:, None]), 0.0)
        row_sum = alpha * row_sum + jnp.sum(p, axis=1)
        acc = alpha[:, None] * acc + plgpu.dot(p.astype(v.dtype), v)
        return acc, m_new, row_sum

    init = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.full((bq,), attention_base.MASK_VALUE, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    acc, _, row_sum = lax.fori_loop(first_ref[tile], last_ref[tile] + 1, body, init)
    o_ref[...] = (acc / jnp.where(row_sum == 0.0, 1.0, row_sum)[:, None]).astype(o_ref.dtype)


def check(q, k_pages, *args, **options) -> str | None:
    if reason := base.layout_unsupported(options):
        return reason
    ps, d = k_pages.shape[1], k_pages.shape[3]
    if ps < 16 or ps & (ps - 1):
        return f"page_size {ps} is not a power of two >= 16 (Triton tiles)"
    if d < 16 or d & (d - 1):
        return f"head_dim {d} is not a power of two >= 16 (Triton tiles)"
    return base.dtype_mismatch(q, k_pages)


def run(q, k_pages, v_pages, *batch, config: Config, **options):
    """The arguments are `base`'s (`batch`: kv_lens, block_tables, query_start_loc, num_seqs);
    one program per (query tile, query head) reads the cache in place."""
    st, tl, q_tiles, block_tables = base.prepare(
        q, k_pages, *batch, block_q=config.block_q, **options
    )
    n_tiles, bq, hq, d = q_tiles.shape
    whole = lambda shape: pl.BlockSpec(shape, lambda i, h: (0,) * len(shape))
    out = pl.pallas_call(
        functools.partial(_kernel, st=st),
        grid=(n_tiles, hq),
        in_specs=[
            whole((n_tiles,)),
            whole((n_tiles,)),
            whole((n_tiles,)),
            whole((n_tiles,)),
            whole(block_tables.shape),
            pl.BlockSpec((None, bq, None, d), lambda i, h: (i, 0, h, 0)),
            whole(k_pages.shape),
            whole(v_pages.shape),
        ],
        out_specs=pl.BlockSpec((None, bq, None, d), lambda i, h: (i, 0, h, 0)),
        out_shape=jax.ShapeDtypeStruct(q_tiles.shape, q.dtype),
        compiler_params=plgpu.CompilerParams(
            num_warps=config.num_warps, num_stages=config.num_stages
        ),
        interpret=st.interpret,
        name="kernlib_ragged_paged_attention",
    )(tl.seq, tl.pos0, tl.first_page, tl.last_page, block_tables, q_tiles, k_pages, v_pages)
    return base.scatter_tiles(out, tl)
