from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernlib_testutil import assert_close

from jaxstack import kernlib


def make_batch(q_lens, kv_lens, *, page_size=16, heads=4, kv_heads=2, live=None, dtype="float32"):
    """Mixed prefill chunks and decodes, head_dim 16, then 3 padding rows; pages shuffled, unused
    block-table slots are -1."""
    head_dim, pad_tokens, seed = 16, 3, 0
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


# The checks both Pallas kernels share (their test modules differ only in what their tiles allow).


def check_mixed_batch(impl):
    """Prefill chunks and decodes, block-table holes, a dead sequence and padding rows."""
    batch = make_batch([20, 1, 5, 1, 0], [20, 37, 40, 1, 0], live=4)
    out = compare(impl, batch, sliding_window=9, logits_soft_cap=3.0)
    assert float(jnp.abs(out[27:]).max()) == 0.0


# (q_lens, kv_lens) of the slow sweep: all decodes, a mix, one whole prefill
SWEEP_LENS = [([1] * 6, [1, 16, 17, 33, 64, 5]), ([33, 1, 16], [70, 9, 16]), ([40], [40])]


def check_sweep(impl, dtype, lens, *, page_size, block_q):
    """Every option set, with the default config and with a small `block_q`."""
    batch = make_batch(*lens, page_size=page_size, heads=6, kv_heads=2, dtype=dtype)
    for opts in (dict(), dict(sliding_window=5), dict(logits_soft_cap=2.0, scale=0.2)):
        for cfg in (None, {"block_q": block_q}):
            compare(impl, batch, config=cfg, **opts)


@pytest.fixture
def rpa_checks():
    """The shared checks: `mixed_batch(impl)`, `sweep(impl, dtype, lens, ...)`."""
    return SimpleNamespace(mixed_batch=check_mixed_batch, sweep=check_sweep)


def pytest_generate_tests(metafunc):
    """A test asking for `rpa_sweep_lens` runs once per SWEEP_LENS entry (one list for both
    kernels' sweeps; a decorator could not share it, test modules cannot import conftest)."""
    if "rpa_sweep_lens" in metafunc.fixturenames:
        metafunc.parametrize("rpa_sweep_lens", SWEEP_LENS)
