"""Cases and the comparison every attention implementation is tested with."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernlib_testutil import assert_close, vjp_against_xla

from jaxstack import kernlib


def make_case(b, t, hq, hkv, d, dtype="float32", segments=None, seed=0):
    """Random q/k/v; `segments` is a list of per-row segment-length lists ((0, n) = padding)."""
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (b, t, hq, d), dtype)
    k = jax.random.normal(ks[1], (b, t, hkv, d), dtype)
    v = jax.random.normal(ks[2], (b, t, hkv, d), dtype)
    seg = None
    if segments is not None:
        rows = []
        for row in segments:
            ids = np.concatenate([np.full(n, sid, np.int32) for sid, n in row])
            assert ids.size == t, row
            rows.append(ids)
        seg = jnp.asarray(np.stack(rows))
    return q, k, v, seg


def cotangent(shape, dtype):
    """One set of output cotangents for implementation and reference (drawn in f32, then
    rounded to the tested dtype, so both see the same numbers)."""
    return jax.random.normal(jax.random.key(7), shape, jnp.float32).astype(dtype)


def compare(impl, case, config=None, **options):
    q, k, v, seg = case
    op = lambda q, k, v, **kw: kernlib.attention(q, k, v, segment_ids=seg, **options, **kw)
    # the reference runs in f32 on the same (possibly rounded) inputs
    (out, grads), (ref_out, ref_grads) = vjp_against_xla(
        op, (q, k, v), cotangent(q.shape, q.dtype), impl, config
    )
    dtype = q.dtype
    assert out.dtype == dtype
    assert_close(out, ref_out, "fwd", dtype, f"{impl} out")
    for name, g, r in zip("qkv", grads, ref_grads, strict=True):
        assert_close(g, r, "grad", dtype, f"{impl} d{name}")
    return out, grads


@pytest.fixture
def attention_compare():
    return compare


@pytest.fixture
def attention_case():
    return make_case


# The shape sweep (slow): odd lengths, GQA ratios, packed and empty segments, every feature.
SWEEP = [
    dict(b=1, t=1, hq=2, hkv=1, d=16),
    dict(b=2, t=17, hq=4, hkv=4, d=16),
    dict(b=1, t=33, hq=6, hkv=2, d=32),
    dict(b=2, t=64, hq=4, hkv=1, d=16),
    dict(b=1, t=130, hq=2, hkv=2, d=16),
]
FEATURES = [
    dict(),
    dict(causal=False),
    dict(sliding_window=7),
    dict(causal=False, sliding_window=5),
    dict(logits_soft_cap=3.0, scale=0.3),
    dict(segments=True),
    dict(segments=True, sliding_window=4, logits_soft_cap=2.0),
]


def sweep_segments(b, t):
    """Packed documents, a padding tail, and (row 1) an all-padding row (empty segments)."""
    rows = []
    for i in range(b):
        if i == 1:
            rows.append([(0, t)])
            continue
        a = max(1, t // 3)
        c = max(0, t - a - 2)
        row = [(1, a), (2, c), (0, t - a - c)]
        rows.append([(s, n) for s, n in row if n > 0])
    return rows


def check_sweep(impl, dtype, config=None):
    """The slow sweep: every shape with every feature set."""
    for shape in SWEEP:
        for feats in FEATURES:
            feats = dict(feats)
            segs = sweep_segments(shape["b"], shape["t"]) if feats.pop("segments", 0) else None
            compare(impl, make_case(**shape, dtype=dtype, segments=segs), config=config, **feats)


@pytest.fixture
def attention_check_sweep():
    return check_sweep
