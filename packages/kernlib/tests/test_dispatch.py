"""Implementation choice: CPU picks xla (or an op's custom call for CPU), explicit requests
are honoured or refused clearly, tuned winners are reused, and fallbacks are logged once with
the reason."""

import json
import logging

import jax.numpy as jnp
import pytest

from jaxstack import kernlib
from jaxstack.kernlib._src import device, dispatch, native, tuning
from jaxstack.kernlib.ops.attention import api as attention_api
from jaxstack.kernlib.ops.attention import pallas_triton

Q = jnp.ones((1, 8, 2, 16))


def all_op_calls():
    qt = type("QT", (), {})()
    qt.values, qt.scales = jnp.ones((16, 8), jnp.int8), jnp.ones((1, 8))
    qt.zero_points, qt.dtype, qt.shape = None, jnp.float32, (16, 8)
    pages = jnp.ones((3, 16, 1, 16))
    return {
        "attention": ((Q, Q, Q), {}),
        "rms_norm": ((jnp.ones((4, 8)),), {}),
        "grouped_matmul": ((jnp.ones((4, 8)), jnp.ones((2, 8, 4)), jnp.array([2, 2])), {}),
        "quantized_matmul": ((jnp.ones((2, 16)), qt), {}),
        "ragged_paged_attention": (
            (
                jnp.ones((2, 2, 16)),
                pages,
                pages,
                jnp.array([5]),
                jnp.array([[1]]),
                jnp.array([0, 2]),
            ),
            {},
        ),
    }


def test_cpu_picks_xla_for_every_op_without_a_cpu_kernel():
    assert device.platform() == "cpu"
    calls = all_op_calls()
    assert sorted(calls) == sorted(kernlib.OP_NAMES)
    pallas_and_xla = ["pallas_mosaic_tpu", "pallas_triton", "xla"]
    for op, (args, kwargs) in calls.items():
        name, config = kernlib.which_implementation(op, *args, **kwargs)
        if op == "ragged_paged_attention":  # its custom call, where it can be built
            assert kernlib.implementations(op) == ["ffi_cpu", *pallas_and_xla]
            built = not isinstance(native.compiler(), str)
            assert (name, config) == ("ffi_cpu" if built else "xla", None)
        else:
            assert (name, config) == ("xla", None), op
            assert kernlib.implementations(op) == pallas_and_xla


def test_cpu_ignores_a_tuned_pallas_winner_and_logs_why_once(user_cache, caplog):
    spec = attention_api.OP.spec(Q, Q, Q, None, causal=True)
    tuning.TuningCache(user_path=user_cache).record(
        device.device_kind(),
        "attention",
        spec,
        {"implementation": "pallas_triton", "config": {"block_q": 32}},
    )
    dispatch._logged.clear()
    with caplog.at_level(logging.WARNING, logger="jaxstack.kernlib"):
        for _ in range(3):
            assert kernlib.which_implementation("attention", Q, Q, Q)[0] == "xla"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "compiles only for gpu" in lines[0]


def test_explicit_pallas_on_cpu_needs_interpret():
    with pytest.raises(kernlib.UnsupportedError, match="interpret=True"):
        kernlib.attention(Q, Q, Q, implementation="pallas_triton")
    name, cfg = kernlib.which_implementation(
        "attention", Q, Q, Q, implementation="pallas_triton", interpret=True
    )
    assert name == "pallas_triton" and cfg == pallas_triton.Config().to_dict()


def test_unknown_implementation_names_the_choices():
    with pytest.raises(kernlib.ConfigError, match="pallas_mosaic_tpu"):
        kernlib.rms_norm(jnp.ones((2, 4)), implementation="cuda")


def test_explicit_config_wins_and_tuned_config_is_reused(user_cache):
    args = (Q, Q, Q)
    explicit = {"block_q": 32, "block_k": 16}
    _, cfg = kernlib.which_implementation(
        "attention", *args, implementation="pallas_triton", interpret=True, config=explicit
    )
    assert cfg["block_q"] == 32 and cfg["block_k"] == 16
    spec = attention_api.OP.spec(*args, None, causal=True)
    tuned = pallas_triton.Config(block_q=128, block_k=32, num_warps=8).to_dict()
    tuning.TuningCache(user_path=user_cache).record(
        device.device_kind(),
        "attention",
        spec,
        {"implementation": "pallas_triton", "config": tuned},
    )
    for _ in range(2):  # deterministic reuse
        _, cfg = kernlib.which_implementation(
            "attention", *args, implementation="pallas_triton", interpret=True
        )
        assert cfg == tuned


def test_fallback_when_an_implementation_refuses_the_call(caplog):
    refuse = dispatch.Implementation(
        "pallas_triton", run=None, platform=None, check=lambda *a, **k: "head_dim 16 too small"
    )
    op = dispatch.Op(
        name="toy",
        implementations={"pallas_triton": refuse, "xla": dispatch.Implementation("xla", None)},
        spec=lambda *a, **k: "toy",
        example=None,
        timed=None,
    )
    old = dispatch.PREFERENCE["cpu"]
    dispatch.PREFERENCE["cpu"] = ("pallas_triton", "xla")
    try:
        with caplog.at_level(logging.WARNING, logger="jaxstack.kernlib"):
            impl, _ = dispatch.select(op, None, (), {})
    finally:
        dispatch.PREFERENCE["cpu"] = old
    assert impl.name == "xla"
    assert "head_dim 16 too small" in caplog.text
    with pytest.raises(kernlib.UnsupportedError, match="head_dim 16 too small"):
        dispatch.select(op, "pallas_triton", (), {})


def test_spec_keys_are_canonical():
    a = attention_api.OP.spec(Q, Q, Q, None, causal=True, sliding_window=None)
    b = attention_api.OP.spec(Q, Q, Q, None, sliding_window=None, causal=True)
    assert a == b and "float32[1,8,2,16]" in a
    json.dumps({a: 1})
