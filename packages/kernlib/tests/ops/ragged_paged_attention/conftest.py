import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib
from jaxstack.kernlib._src.testing import assert_close


def make_batch(
    q_lens,
    kv_lens,
    *,
    page_size=16,
    heads=4,
    kv_heads=2,
    head_dim=16,
    pad_tokens=3,
    live=None,
    dtype="float32",
    seed=0,
):
    """Mixed prefill chunks and decodes; pages shuffled, unused block-table slots are -1."""
    rng = np.random.default_rng(seed)
    s = len(q_lens)
    per_seq = max(1, max(-(-n // page_size) for n in kv_lens)) + 1
    num_pages = 1 + sum(-(-n // page_size) for n in kv_lens) + 2
    free = rng.permutation(np.arange(1, num_pages))
    block_tables = -np.ones((s, per_seq), np.int32)
    used = 0
    for i, n in enumerate(kv_lens):
        need = -(-n // page_size)
        block_tables[i, :need] = free[used : used + need]
        used += need
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    t = int(cu[-1]) + pad_tokens
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (t, heads, head_dim), dtype)
    k_pages = jax.random.normal(ks[1], (num_pages, page_size, kv_heads, head_dim), dtype)
    v_pages = jax.random.normal(ks[2], (num_pages, page_size, kv_heads, head_dim), dtype)
    num_seqs = None if live is None else jnp.int32(live)
    return (
        q,
        k_pages,
        v_pages,
        jnp.asarray(kv_lens, jnp.int32),
        jnp.asarray(block_tables),
        jnp.asarray(cu),
        num_seqs,
    )


def compare(impl, batch, config=None, **options):
    out = kernlib.ragged_paged_attention(
        *batch, implementation=impl, interpret=True, config=config, **options
    )
    f32 = (
        batch[0].astype(jnp.float32),
        batch[1].astype(jnp.float32),
        batch[2].astype(jnp.float32),
        *batch[3:],
    )
    ref = kernlib.ragged_paged_attention(*f32, implementation="xla", **options)
    assert out.dtype == batch[0].dtype
    assert_close(out, ref, "fwd", batch[0].dtype, impl)
    return out


@pytest.fixture
def rpa_batch():
    return make_batch


@pytest.fixture
def rpa_compare():
    return compare
