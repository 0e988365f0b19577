import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib
from jaxstack.kernlib.ops.ragged_paged_attention import base, xla


def dense_attention(q, keys, values, positions):
    """One sequence: rows at `positions` read keys 0..position (numpy, f64)."""
    g = q.shape[1] // keys.shape[1]
    keys, values = np.repeat(keys, g, axis=1), np.repeat(values, g, axis=1)
    out = np.zeros_like(q)
    for r, p in enumerate(positions):
        logits = np.einsum("hd,khd->hk", q[r], keys[: p + 1]) / np.sqrt(q.shape[-1])
        w = np.exp(logits - logits.max(-1, keepdims=True))
        out[r] = np.einsum("hk,khd->hd", w / w.sum(-1, keepdims=True), values[: p + 1])
    return out


def test_reference_matches_dense_attention_per_sequence(rpa_batch):
    batch = rpa_batch([20, 1, 5, 1, 0], [20, 37, 40, 1, 0], live=4)
    q, kp, vp, kv_lens, bt, cu, _ = (
        None if x is None else np.asarray(x, np.float64) if i < 3 else np.asarray(x)
        for i, x in enumerate(batch)
    )
    out = np.asarray(kernlib.ragged_paged_attention(*batch, implementation="xla"))
    for s in range(4):
        n, ql = int(kv_lens[s]), int(cu[s + 1] - cu[s])
        pages = bt[s, : -(-n // kp.shape[1])]
        keys = np.concatenate([kp[p] for p in pages])[:n]
        values = np.concatenate([vp[p] for p in pages])[:n]
        want = dense_attention(q[cu[s] : cu[s + 1]], keys, values, range(n - ql, n))
        np.testing.assert_allclose(out[cu[s] : cu[s + 1]], want, atol=2e-5, rtol=2e-5)
    assert np.all(out[int(cu[4]) :] == 0)  # padding tokens


def test_holes_in_block_tables_are_never_read(rpa_batch):
    batch = list(rpa_batch([3, 1], [17, 5]))
    out = kernlib.ragged_paged_attention(*batch, implementation="xla")
    bt = np.asarray(batch[4]).copy()
    bt[bt < 0] = 0  # a different value in every hole
    batch[4] = bt
    again = kernlib.ragged_paged_attention(*batch, implementation="xla")
    np.testing.assert_array_equal(np.asarray(out), np.asarray(again))


@pytest.mark.parametrize(
    ("q_lens", "kv_lens"),
    [
        ([1] * 5, [1, 300, 17, 520, 64]),  # decodes: one row per group
        ([40, 1, 300, 1], [40, 700, 300, 33]),  # prefill chunks: tiles of 16 rows
    ],
)
@pytest.mark.parametrize(
    "options", [{}, {"sliding_window": 100}, {"logits_soft_cap": 2.0, "scale": 0.3}]
)
def test_chunked_walk_equals_the_gather_everything_reference(rpa_batch, q_lens, kv_lens, options):
    # Contexts past several 256-position chunks, wide block tables with holes, padding rows
    # and a dead sequence: the chunked loop must give the reference's numbers.
    batch = rpa_batch(q_lens, kv_lens, page_size=8, live=len(q_lens) - 1)
    out = kernlib.ragged_paged_attention(*batch, implementation="xla", **options)
    want = base.reference(*batch, **options)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("options", [{}, {"sliding_window": 100}])
def test_decode_chunks_cut_by_bytes_give_the_reference_numbers(rpa_batch, monkeypatch, options):
    # A byte limit this low cuts the decodes' chunks down to one page each.
    monkeypatch.setattr(xla, "CHUNK_BYTES", 1024)
    batch = rpa_batch([1] * 6, [1, 300, 17, 520, 64, 129], page_size=8, live=5)
    out = kernlib.ragged_paged_attention(*batch, implementation="xla", **options)
    want = base.reference(*batch, **options)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)


def _decode_hlo(seqs: int, kv_layout: str = "head_major", q_len: int = 1) -> str:
    """The compiled HLO of the XLA implementation for `seqs` sequences of 200 cached tokens
    (4 kv heads of 64, float32, 16-position pages), `q_len` query rows each."""
    page, heads, dim, width = 16, 4, 64, 16
    pages = jnp.ones((seqs * width + 1, page, heads, dim))
    if kv_layout == "head_major":
        pages = pages.transpose(2, 0, 1, 3)
    tables = jnp.arange(1, seqs * width + 1, dtype=jnp.int32).reshape(seqs, width)
    kv_lens = jnp.full((seqs,), 200, jnp.int32)
    starts = jnp.arange(0, seqs * q_len + 1, q_len, dtype=jnp.int32)
    call = jax.jit(
        lambda q, k, v: kernlib.ragged_paged_attention(
            q, k, v, kv_lens, tables, starts, implementation="xla", kv_layout=kv_layout
        )
    )
    return call.lower(jnp.ones((seqs * q_len, heads, dim)), pages, pages).compile().as_text()


def _fusion_output_bytes(hlo: str, name: str = "") -> list[int]:
    """Bytes of the f32 arrays written by the fusions whose name contains `name`."""
    found = re.finditer(rf"%\S*{name}\S* = f32\[([\d,]*)\]\{{[\d,]*\}} fusion\(", hlo)
    return [4 * math.prod(int(d) for d in m[1].split(",") if d) for m in found]


def test_decode_steps_gather_at_most_chunk_bytes_of_keys_at_a_time():
    # 32 decodes gathered 8 MiB of keys per 256-position chunk, which the matmul then read back
    # from memory; they now read 64 positions at a time. 8 decodes (2 MiB) and prefill tiles
    # keep 256-position chunks.
    full_chunk = lambda seqs: seqs * 256 * 4 * 64 * 4
    largest = lambda seqs, q_len=1: max(_fusion_output_bytes(_decode_hlo(seqs, q_len=q_len)))
    assert largest(32) <= xla.CHUNK_BYTES < full_chunk(32)
    assert largest(8) == full_chunk(8) <= xla.CHUNK_BYTES
    assert largest(4, q_len=16) >= full_chunk(4)


def _bytes_accessed(block_tables):
    """XLA's count of the bytes one call reads and writes: 16 single-token decodes, 8 cached
    tokens each (one 16-slot page), `block_tables` [16, width] (at 16 pages wide, one chunk
    of 256 positions: 2 MiB of keys, within `xla.CHUNK_BYTES`)."""
    s, page, heads, dim = 16, 16, 4, 32
    q = jnp.ones((s, heads, dim))
    pages = jnp.ones((s + 1, page, heads, dim))
    kv_lens = jnp.full((s,), 8, jnp.int32)
    starts = jnp.arange(s + 1, dtype=jnp.int32)
    call = jax.jit(
        lambda q, k, v, bt: kernlib.ragged_paged_attention(
            q, k, v, kv_lens, bt, starts, jnp.int32(s), implementation="xla"
        )
    )
    cost = call.lower(q, pages, pages, block_tables).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["bytes accessed"]


def test_the_walk_reads_no_wider_than_the_block_tables():
    # Short sequences (an RL rollout's: one page each) must not be padded to a full 256-token
    # chunk per row; that made every engine step of a rollout read 16x the cache it holds.
    one_page = jnp.arange(1, 17, dtype=jnp.int32)[:, None]
    sixteen = jnp.concatenate([one_page, jnp.full((16, 15), -1, jnp.int32)], axis=1)
    assert _bytes_accessed(one_page) < _bytes_accessed(sixteen) / 4


def head_major(batch):
    """The same batch with its cache in the head-major layout [Hkv, num_pages, page_size, D]."""
    q, k_pages, v_pages, *rest = batch
    return (q, k_pages.transpose(2, 0, 1, 3), v_pages.transpose(2, 0, 1, 3), *rest)


@pytest.mark.parametrize(
    ("q_lens", "kv_lens"),
    [([1] * 5, [1, 300, 17, 520, 64]), ([40, 1, 300, 1], [40, 700, 300, 33])],
)
@pytest.mark.parametrize("options", [{}, {"sliding_window": 100, "logits_soft_cap": 2.0}])
def test_a_head_major_cache_gives_the_page_major_numbers(rpa_batch, q_lens, kv_lens, options):
    batch = rpa_batch(q_lens, kv_lens, page_size=8, live=len(q_lens) - 1)
    want = base.reference(*batch, **options)
    out = kernlib.ragged_paged_attention(
        *head_major(batch), implementation="xla", kv_layout="head_major", **options
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)
    again = base.reference(*head_major(batch), kv_layout="head_major", **options)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(want))


def test_the_cache_shape_is_checked_against_its_layout(rpa_batch):
    batch = rpa_batch([1, 1], [5, 9])  # 2 kv heads of 16, q 4 heads
    with pytest.raises(kernlib.ConfigError, match=r"head_major.*\[Hkv,num_pages,page_size,D\]"):
        kernlib.ragged_paged_attention(*batch, kv_layout="head_major")  # page-major arrays
    with pytest.raises(kernlib.ConfigError, match="kv_layout must be one of"):
        kernlib.ragged_paged_attention(*batch, kv_layout="slot_major")


def test_the_pallas_kernels_refuse_a_head_major_cache(rpa_batch):
    batch = head_major(rpa_batch([1, 1], [5, 9], page_size=16))
    for impl in ("pallas_triton", "pallas_mosaic_tpu"):
        with pytest.raises(kernlib.UnsupportedError, match="read a page-major cache"):
            kernlib.ragged_paged_attention(
                *batch, implementation=impl, interpret=True, kv_layout="head_major"
            )
    # left to choose, dispatch falls back to XLA (on any platform)
    out = kernlib.ragged_paged_attention(*batch, kv_layout="head_major")
    assert out.shape == batch[0].shape


def _transposes(kv_layout):
    """Output sizes in bytes of the transpose fusions (kernels XLA:CPU names for the transpose
    they do) of 8 decodes of 200 cached tokens (one 256-position chunk each; 4 kv heads of
    64, float32). A transpose fused into the gather's own kernel is not one: it writes the
    gathered rows once, in the order the matmuls read."""
    sizes = _fusion_output_bytes(_decode_hlo(8, kv_layout), "transpose")
    return sizes, 8 * 256 * 4 * 64 * 4  # and the bytes of one chunk's keys


def test_head_major_pages_reach_the_matmuls_without_a_transposed_copy():
    # Page-major pages gather as [rows, positions, heads, D] and XLA copies them into the
    # matmuls' [rows, heads, ., .] order: a transpose fusion the size of the keys read. Head-
    # major ones gather in that order; only q-sized transposes (the queries, the output) remain.
    page_major, chunk_bytes = _transposes("page_major")
    assert max(page_major) >= chunk_bytes  # what the check below would catch, as XLA names it
    head_major, _ = _transposes("head_major")
    assert max(head_major, default=0) < chunk_bytes // 64
