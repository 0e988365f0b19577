"""The XLA reference against an independent NumPy loop, and its edge-case guarantees."""

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib


def naive(q, k, v, seg, causal, window, cap, scale):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, hq, _ = q.shape
    g = hq // k.shape[2]
    out = np.zeros_like(q)
    for bi in range(b):
        for h in range(hq):
            for i in range(t):
                logits, vals = [], []
                for j in range(t):
                    if causal and j > i:
                        continue
                    if window is not None and i - j >= window:
                        continue
                    if seg is not None and (seg[bi, i] != seg[bi, j] or seg[bi, i] == 0):
                        continue
                    s = scale * q[bi, i, h] @ k[bi, j, h // g]
                    logits.append(cap * math.tanh(s / cap) if cap else s)
                    vals.append(v[bi, j, h // g])
                if logits:
                    p = np.exp(np.array(logits) - max(logits))
                    out[bi, i, h] = (p / p.sum()) @ np.array(vals)
    return out


@pytest.mark.parametrize(
    "opts",
    [
        dict(causal=True, window=None, cap=None),
        dict(causal=False, window=3, cap=None),
        dict(causal=True, window=4, cap=2.5),
    ],
)
def test_reference_matches_a_naive_loop(attention_case, opts):
    segments = [[(1, 4), (2, 5), (0, 2)], [(3, 11)]]
    q, k, v, seg = attention_case(2, 11, 4, 2, 8, segments=segments)
    out = kernlib.attention(
        q,
        k,
        v,
        segment_ids=seg,
        causal=opts["causal"],
        sliding_window=opts["window"],
        logits_soft_cap=opts["cap"],
        implementation="xla",
    )
    want = naive(q, k, v, np.asarray(seg), opts["causal"], opts["window"], opts["cap"], 8**-0.5)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=2e-5)


def test_padding_rows_give_zero_output_and_finite_gradients(attention_case):
    q, k, v, seg = attention_case(2, 6, 2, 2, 8, segments=[[(1, 3), (0, 3)], [(0, 6)]])
    f = lambda q, k, v: kernlib.attention(q, k, v, segment_ids=seg, implementation="xla")
    out = f(q, k, v)
    assert np.all(np.asarray(out)[0, 3:] == 0) and np.all(np.asarray(out)[1] == 0)
    grads = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))(q, k, v)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))
    # nothing flows into padding keys, nor out of padding queries
    assert np.all(np.asarray(grads[0])[1] == 0) and np.all(np.asarray(grads[1])[0, 3:] == 0)


def test_gqa_equals_repeated_kv_heads(attention_case):
    q, k, v, _ = attention_case(1, 9, 6, 2, 8)
    out = kernlib.attention(q, k, v, implementation="xla")
    rep = kernlib.attention(q, jnp.repeat(k, 3, axis=2), jnp.repeat(v, 3, axis=2))
    np.testing.assert_allclose(np.asarray(out), np.asarray(rep), atol=1e-6)


def test_signature_is_nnlibs_attention_fn_contract():
    params = inspect.signature(kernlib.attention).parameters
    for name in ("segment_ids", "causal", "sliding_window", "logits_soft_cap", "scale"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["causal"].default is True and params["scale"].default is None


@pytest.mark.parametrize(
    "shapes,needle",
    [
        (((1, 4, 3, 8), (1, 4, 2, 8)), "multiple of num kv heads"),
        (((1, 4, 2, 8), (1, 5, 2, 8)), "matching q's B, T and D"),
        (((4, 2, 8), (4, 2, 8)), "[B,T,Hq,D]"),
    ],
)
def test_bad_shapes_raise_clear_errors(shapes, needle):
    q, k = (jnp.zeros(s) for s in shapes)
    with pytest.raises(kernlib.ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        kernlib.attention(q, k, k)


def test_bad_options_raise(attention_case):
    q, k, v, _ = attention_case(1, 4, 2, 2, 8)
    with pytest.raises(kernlib.ConfigError, match="sliding_window"):
        kernlib.attention(q, k, v, sliding_window=0)
    with pytest.raises(kernlib.ConfigError, match="segment_ids"):
        kernlib.attention(q, k, v, segment_ids=jnp.ones((1, 5), jnp.int32))
