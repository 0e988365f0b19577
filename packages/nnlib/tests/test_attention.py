import jax
import jax.numpy as jnp
import numpy as np
import pytest
from nnlib_testutil import max_diff

from jaxstack import nnlib


def reference(q, k, v, segment_ids, *, window=None, cap=None, scale=None):
    """Loop-by-loop NumPy attention: repeat kv heads, mask, softmax, zero padding rows."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, d = q.shape
    rep = h // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    scale = d**-0.5 if scale is None else scale
    out = np.zeros_like(q)
    for bi in range(b):
        for i in range(t):
            allowed = [
                j
                for j in range(t)
                if segment_ids[bi, j] == segment_ids[bi, i] != 0
                and j <= i
                and (window is None or i - j < window)
            ]
            if not allowed:
                continue
            for hi in range(h):
                s = np.array([q[bi, i, hi] @ k[bi, j, hi] * scale for j in allowed])
                if cap is not None:
                    s = cap * np.tanh(s / cap)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[bi, i, hi] = sum(pj * v[bi, j, hi] for pj, j in zip(p, allowed, strict=True))
    return out


def qkv(b=2, t=9, h=4, kh=2, d=8, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(ks[0], (b, t, h, d)),
        jax.random.normal(ks[1], (b, t, kh, d)),
        jax.random.normal(ks[2], (b, t, kh, d)),
    )


@pytest.mark.parametrize(
    "window,cap,kh", [(None, None, 2), (3, None, 1), (None, 2.0, 4), (4, 1.5, 2)]
)
def test_default_attention_matches_reference(window, cap, kh):
    q, k, v = qkv(kh=kh)
    seg = np.array([[1, 1, 1, 2, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    out = nnlib.dot_product_attention(
        q, k, v, segment_ids=jnp.asarray(seg), sliding_window=window, logits_soft_cap=cap, scale=0.3
    )
    assert out.shape == q.shape
    assert max_diff(out, reference(q, k, v, seg, window=window, cap=cap, scale=0.3)) < 1e-5


def test_padding_is_isolated_and_documents_do_not_mix():
    q, k, v = qkv(b=1)
    seg = jnp.array([[1, 1, 1, 2, 2, 2, 0, 0, 0]], jnp.int32)
    out = nnlib.dot_product_attention(q, k, v, segment_ids=seg)
    assert np.all(np.asarray(out[0, 6:]) == 0.0)  # padding queries: exactly zero, not NaN
    # Changing document 1 and the padding keys leaves document 2's outputs unchanged.
    k2 = k.at[:, :3].set(100.0).at[:, 6:].set(-50.0)
    v2 = v.at[:, :3].set(7.0).at[:, 6:].set(9.0)
    out2 = nnlib.dot_product_attention(q, k2, v2, segment_ids=seg)
    assert max_diff(out[:, 3:6], out2[:, 3:6]) == 0.0


def test_gradients_are_finite_with_padding():
    q, k, v = qkv(b=1)
    seg = jnp.array([[1, 1, 0, 0, 0, 0, 0, 0, 0]], jnp.int32)
    g = jax.grad(lambda q: nnlib.dot_product_attention(q, k, v, segment_ids=seg).sum())(q)
    assert np.all(np.isfinite(np.asarray(g)))
    assert np.all(np.asarray(g[0, 2:]) == 0.0)


@pytest.mark.parametrize("kh", [1, 2])
def test_long_causal_attention_split_in_halves_matches_one_pass(kh):
    """At T >= SPLIT_MIN_LEN the default skips the future half of the keys for the first half."""
    from jaxstack.nnlib._src.attention_fn import SPLIT_MIN_LEN, attention_mask, masked_attention

    t = SPLIT_MIN_LEN
    q, k, v = qkv(b=2, t=t, h=2, kh=kh, d=8)
    seg = np.ones((2, t), np.int32)
    seg[0, 100:200], seg[0, 200:] = 2, 0  # a document across the split, then padding
    seg = jnp.asarray(seg)
    pos = jnp.broadcast_to(jnp.arange(t), (2, t))
    mask = attention_mask(pos, pos, seg, seg)
    w = jax.random.normal(jax.random.key(5), q.shape)

    def loss(attn, q, k, v):
        return (attn(q, k, v) * w).sum()

    split = lambda q, k, v: nnlib.dot_product_attention(q, k, v, segment_ids=seg)
    whole = lambda q, k, v: masked_attention(q, k, v, mask)
    assert "concatenate" in str(jax.make_jaxpr(split)(q, k, v))  # the split path ran
    assert max_diff(split(q, k, v), whole(q, k, v)) < 1e-5
    assert np.all(np.asarray(split(q, k, v)[0, 200:]) == 0.0)
    grads_split = jax.grad(lambda *a: loss(split, *a), argnums=(0, 1, 2))(q, k, v)
    grads_whole = jax.grad(lambda *a: loss(whole, *a), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(grads_split, grads_whole, strict=True):
        assert max_diff(a, b) < 1e-4
    ref = reference(q[1:], k[1:], v[1:], np.asarray(seg[1:]))
    assert max_diff(split(q, k, v)[1:], ref) < 1e-5
