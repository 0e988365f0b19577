"""Ragged paged attention: semantics, the XLA reference, and the set-up shared by kernels.

Inputs (vLLM-style, the layout jaxstack.serving's paged cache uses):

- `q` [T, Hq, D]: the new tokens of all sequences, concatenated; sequence s owns rows
  `query_start_loc[s] : query_start_loc[s + 1]` (a prefill chunk, or 1 row for a decode);
- `k_pages`, `v_pages`: the cache, already holding the new tokens' keys and values, in one
  of two layouts (`kv_layout`): "page_major" [num_pages, page_size, Hkv, D] (vLLM's, the
  default) or "head_major" [Hkv, num_pages, page_size, D], where a gather of pages is already
  in the [Hkv, pages, positions, D] order the attention matmuls read (the XLA implementation
  then copies no transposed keys and values; the Pallas kernels read page-major only);
- `kv_lens` [S]: tokens in each sequence's cache (including its new ones);
- `block_tables` [S, pages_per_seq]: page ids of each sequence in order; entries past a
  sequence's last page are never read (may be -1: "holes"), pages need not be contiguous;
- `num_seqs`: optional int32 scalar/[1], live sequences (the rest, and rows of q past
  `query_start_loc[num_seqs]`, are padding and produce 0).

The q rows of sequence s are its last `q_len` tokens: row i sits at position
`kv_lens[s] - q_len + i` and reads cache positions <= its own (causal), and within
`sliding_window` positions when given.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxstack.kernlib._src.errors import ConfigError
from jaxstack.kernlib._src.spec import spec_key
from jaxstack.kernlib.ops.attention import base as attention_base

PAGE_MAJOR, HEAD_MAJOR = "page_major", "head_major"
LAYOUTS = {PAGE_MAJOR: "[num_pages,page_size,Hkv,D]", HEAD_MAJOR: "[Hkv,num_pages,page_size,D]"}


class CacheDims(NamedTuple):
    num_pages: int
    page_size: int
    kv_heads: int
    head_dim: int


def cache_dims(k_pages, kv_layout: str = PAGE_MAJOR) -> CacheDims:
    """The cache's dimensions, whichever its layout."""
    if kv_layout == HEAD_MAJOR:
        hkv, num_pages, page_size, d = k_pages.shape
        return CacheDims(num_pages, page_size, hkv, d)
    return CacheDims(*k_pages.shape)


def page_major(pages, kv_layout: str):
    """A cache array in the page-major layout (a transposed copy when it is head-major)."""
    return pages.transpose(1, 2, 0, 3) if kv_layout == HEAD_MAJOR else pages


def validate(
    q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, kv_layout=PAGE_MAJOR
) -> None:
    if kv_layout not in LAYOUTS:
        raise ConfigError(f"kv_layout must be one of {sorted(LAYOUTS)}, got {kv_layout!r}")
    if q.ndim != 3 or k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ConfigError(
            f"expected q [T,Hq,D] and k_pages, v_pages {LAYOUTS[kv_layout]} ({kv_layout}); got "
            f"q {q.shape}, k_pages {k_pages.shape}, v_pages {v_pages.shape}"
        )
    dims = cache_dims(k_pages, kv_layout)
    if q.shape[2] != dims.head_dim or q.shape[1] % dims.kv_heads:
        raise ConfigError(
            f"q heads {q.shape[1]} must be a multiple of kv heads {dims.kv_heads} and head "
            f"dims must agree (q {q.shape[2]}, cache {dims.head_dim}; {kv_layout} cache "
            f"{LAYOUTS[kv_layout]})"
        )
    s = kv_lens.shape[0]
    if block_tables.ndim != 2 or block_tables.shape[0] != s or query_start_loc.shape != (s + 1,):
        raise ConfigError(
            f"with kv_lens [{s}], block_tables must be [{s}, pages_per_seq] and "
            f"query_start_loc [{s + 1}]; got {block_tables.shape} and {query_start_loc.shape}"
        )


def layout_unsupported(options) -> str | None:
    """Why a Pallas kernel cannot run the call (its cache is head-major), or None."""
    if options.get("kv_layout", PAGE_MAJOR) != PAGE_MAJOR:
        return (
            f"the Pallas kernels read a page-major cache {LAYOUTS[PAGE_MAJOR]}, not "
            f"kv_layout={options['kv_layout']!r}; use kv_layout='page_major' or "
            f"implementation='xla'"
        )
    return None


def dtype_mismatch(q, k_pages) -> str | None:
    """Why a kernel cannot run (q and the cache differ in dtype), or None; both kernels feed
    q and cache tiles to one matmul, so they need one dtype."""
    if q.dtype != k_pages.dtype:
        return f"q dtype {q.dtype} differs from the cache's {k_pages.dtype}"
    return None


class Rows(NamedTuple):
    """Per-token facts: owning sequence, absolute position, and whether the row is live."""

    seq: jax.Array
    pos: jax.Array
    active: jax.Array
    offset: jax.Array  # row index within its sequence's chunk


def live_seqs(num_seqs, s: int):
    return jnp.asarray(s if num_seqs is None else num_seqs, jnp.int32).reshape(())


def token_rows(kv_lens, query_start_loc, num_seqs, t: int) -> Rows:
    s = kv_lens.shape[0]
    n = live_seqs(num_seqs, s)
    cu = query_start_loc.astype(jnp.int32)
    tok = jnp.arange(t, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu[1:], tok, side="right"), 0, s - 1).astype(jnp.int32)
    active = jnp.logical_and(tok < cu[n], seq < n)
    q_len = cu[seq + 1] - cu[seq]
    offset = tok - cu[seq]
    pos = kv_lens[seq] - q_len + offset
    return Rows(seq, pos, active, offset)


def reference(
    q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs=None, **options
):
    """Every page of each token's block table gathered at once: simple, and the numbers every
    implementation is checked against. `options`: scale, sliding_window, logits_soft_cap,
    kv_layout (a head-major cache is transposed to page-major first)."""
    layout = options.pop("kv_layout", PAGE_MAJOR)
    k_pages, v_pages = page_major(k_pages, layout), page_major(v_pages, layout)
    st = static(q, k_pages, block_tables, **options)
    t, hkv, d = q.shape[0], st.kv_heads, st.head_dim
    rows = token_rows(kv_lens, query_start_loc, num_seqs, t)
    pages = jnp.clip(block_tables[rows.seq], 0, k_pages.shape[0] - 1)  # [T, P]
    keys = k_pages[pages].reshape(t, -1, hkv, d)
    values = v_pages[pages].reshape(t, -1, hkv, d)
    logits = jnp.einsum(
        "thgd,tkhd->thgk", q.reshape(t, hkv, st.group, d), keys, preferred_element_type=jnp.float32
    )
    logits = attention_base.soft_cap(logits * st.scale, st.cap)
    k_pos = jnp.arange(keys.shape[1], dtype=jnp.int32)[None, :]
    q_pos = rows.pos[:, None]
    mask = k_pos <= q_pos
    if st.window is not None:
        mask = jnp.logical_and(mask, q_pos - k_pos < st.window)
    mask = jnp.logical_and(mask, rows.active[:, None])[:, None, None, :]
    mask = jnp.broadcast_to(mask, logits.shape)
    masked = jnp.where(mask, logits, attention_base.MASK_VALUE)
    row_max = jnp.max(masked, axis=-1, keepdims=True)
    unnorm = jnp.where(mask, jnp.exp(masked - row_max), 0.0)
    denom = jnp.sum(unnorm, axis=-1, keepdims=True)
    probs = unnorm / jnp.where(denom == 0.0, 1.0, denom)
    out = jnp.einsum(
        "thgk,tkhd->thgd", probs.astype(values.dtype), values, preferred_element_type=jnp.float32
    )
    return out.reshape(q.shape).astype(q.dtype)


class Tiles(NamedTuple):
    """Query tiles: each holds up to block_q consecutive rows of one sequence."""

    seq: jax.Array  # [V]
    pos0: jax.Array  # position of the tile's first row
    rows: jax.Array  # live rows in the tile (0 for unused tiles)
    first_page: jax.Array
    last_page: jax.Array  # -1 for unused tiles
    token_index: jax.Array  # [V, block_q] row of q (T = padding row)
    token_tile: jax.Array  # [T] tile of each token
    token_row: jax.Array  # [T] row within that tile
    token_active: jax.Array  # [T]


def tiles(kv_lens, query_start_loc, num_seqs, t: int, block_q: int, page_size: int, window):
    s = kv_lens.shape[0]
    n = live_seqs(num_seqs, s)
    cu = query_start_loc.astype(jnp.int32)
    q_lens = jnp.where(jnp.arange(s) < n, cu[1:] - cu[:-1], 0)
    per_seq = -(-q_lens // block_q)
    cum = jnp.cumsum(per_seq)
    off = cum - per_seq
    n_tiles = -(-t // block_q) + s
    v = jnp.arange(n_tiles, dtype=jnp.int32)
    valid = v < cum[-1]
    seq = jnp.clip(jnp.searchsorted(cum, v, side="right"), 0, s - 1).astype(jnp.int32)
    local = v - off[seq]
    rows = jnp.where(valid, jnp.clip(q_lens[seq] - local * block_q, 0, block_q), 0)
    pos0 = kv_lens[seq] - q_lens[seq] + local * block_q
    last_page = jnp.where(rows > 0, (pos0 + rows - 1) // page_size, -1)
    first_page = jnp.zeros_like(last_page)
    if window is not None:
        first_page = jnp.maximum(0, (pos0 - (window - 1)) // page_size)
    r = jnp.arange(block_q, dtype=jnp.int32)
    first_token = cu[seq][:, None] + local[:, None] * block_q
    token_index = jnp.where(r[None, :] < rows[:, None], first_token + r, t)
    tr = token_rows(kv_lens, query_start_loc, num_seqs, t)
    token_tile = off[tr.seq] + tr.offset // block_q
    token_row = tr.offset % block_q
    return Tiles(
        seq,
        pos0.astype(jnp.int32),
        rows.astype(jnp.int32),
        first_page.astype(jnp.int32),
        last_page.astype(jnp.int32),
        token_index.astype(jnp.int32),
        jnp.clip(token_tile, 0, n_tiles - 1).astype(jnp.int32),
        token_row.astype(jnp.int32),
        tr.active,
    )


def gather_tiles(q, tl: Tiles):
    """q [T, Hq, D] -> [V, block_q, Hq, D] (rows past a tile's end are zeros)."""
    q_pad = jnp.concatenate([q, jnp.zeros((1, *q.shape[1:]), q.dtype)], axis=0)
    return q_pad[tl.token_index]


def scatter_tiles(out_tiles, tl: Tiles):
    """[V, block_q, Hq, D] -> [T, Hq, D], zero for padding rows."""
    out = out_tiles[tl.token_tile, tl.token_row]
    return jnp.where(tl.token_active[:, None, None], out, jnp.zeros((), out.dtype))


@dataclasses.dataclass(frozen=True)
class Static:
    """Compile-time facts of one call (hashable: a Pallas kernel's static argument)."""

    heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    pages_per_seq: int
    scale: float
    cap: float | None
    window: int | None
    interpret: bool

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads


class Prepared(NamedTuple):
    """A call set up for a Pallas kernel: its static facts, query tiles and valid page ids."""

    st: Static
    tiles: Tiles
    q_tiles: jax.Array  # [V, block_q, Hq, D]
    block_tables: jax.Array  # int32, clipped to [0, num_pages): holes read a real page


def static(q, k_pages, block_tables, **options) -> Static:
    """The shapes every implementation reads (of a cache in the layout `kv_layout`), and the
    options `scale`, `sliding_window`, `logits_soft_cap` and `interpret` as a `Static` (other
    options, such as `config`, are not its business)."""
    _, hq, d = q.shape
    _, page_size, hkv, _ = cache_dims(k_pages, options.get("kv_layout", PAGE_MAJOR))
    window, cap = options.get("sliding_window"), options.get("logits_soft_cap")
    return Static(
        heads=hq,
        kv_heads=hkv,
        head_dim=d,
        page_size=page_size,
        pages_per_seq=block_tables.shape[1],
        scale=attention_base.default_scale(d, options.get("scale")),
        cap=None if cap is None else float(cap),
        window=None if window is None else int(window),
        interpret=bool(options.get("interpret", False)),
    )


def prepare(
    q, k_pages, kv_lens, block_tables, query_start_loc, num_seqs=None, *, block_q, **options
):
    """What both Pallas kernels do first: the `Static`, and the queries cut into tiles of
    `block_q` rows of one sequence and gathered."""
    st = static(q, k_pages, block_tables, **options)
    tl = tiles(kv_lens, query_start_loc, num_seqs, q.shape[0], block_q, st.page_size, st.window)
    num_pages = cache_dims(k_pages, options.get("kv_layout", PAGE_MAJOR)).num_pages
    pages = jnp.clip(block_tables.astype(jnp.int32), 0, num_pages - 1)
    return Prepared(st, tl, gather_tiles(q, tl), pages)


def spec(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs=None, **o) -> str:
    return spec_key(
        {"q": q, "k_pages": k_pages, "block_tables": block_tables},
        {
            "sliding_window": o.get("sliding_window") is not None,
            "soft_cap": o.get("logits_soft_cap") is not None,
            # named only when head-major: the page-major keys stay what they were
            **({"kv_layout": HEAD_MAJOR} if o.get("kv_layout") == HEAD_MAJOR else {}),
        },
    )


def example(dims: dict[str, int], dtype: str = "bfloat16", seed: int = 0):
    """A decode batch: `seqs` sequences of `context` cached tokens, one new token each."""
    s, ctx = dims.get("seqs", 64), dims.get("context", 2048)
    hq, hkv, d = dims.get("heads", 32), dims.get("kv_heads", 8), dims.get("head_dim", 128)
    ps, q_len = dims.get("page_size", 16), dims.get("q_len", 1)
    per_seq = math.ceil(ctx / ps)
    num_pages = s * per_seq + 1
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (s * q_len, hq, d), dtype)
    k_pages = jax.random.normal(keys[1], (num_pages, ps, hkv, d), dtype)
    v_pages = jax.random.normal(keys[2], (num_pages, ps, hkv, d), dtype)
    perm = jax.random.permutation(keys[3], num_pages - 1)[: s * per_seq] + 1
    block_tables = perm.reshape(s, per_seq).astype(jnp.int32)
    kv_lens = jnp.full((s,), ctx, jnp.int32)
    cu = jnp.arange(s + 1, dtype=jnp.int32) * q_len
    return (q, k_pages, v_pages, kv_lens, block_tables, cu, None), {}


def timed(fn):
    return fn
