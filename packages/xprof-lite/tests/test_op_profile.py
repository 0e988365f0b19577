"""Per-op FLOPs, bytes, categories and trip counts from optimised HLO modules."""

import pathlib

import jax
import jax.numpy as jnp
import pytest

from jaxstack import xprof_lite
from jaxstack.xprof_lite._src.hlo import parse_module, parse_shapes


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def the_op(profile, category):
    ops = [op for op in profile.ops if op.category == category]
    assert len(ops) == 1, [(op.name, op.category) for op in profile.ops]
    return ops[0]


def test_matmul_has_exact_flops_and_bytes():
    m, k, n = 96, 40, 24
    prof = xprof_lite.op_profile(lambda a, b: a @ b, sds(m, k), sds(k, n))
    op = the_op(prof, "matmul")
    assert op.flops == 2 * m * n * k
    assert op.bytes == 4 * (m * k + k * n + m * n)
    assert op.executions == 1
    assert prof.total_flops == 2 * m * n * k


def test_batched_einsum_counts_batch_and_contracting_dims():
    b, m, k, n = 3, 16, 20, 8
    prof = xprof_lite.op_profile(
        lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y), sds(b, m, k), sds(b, k, n)
    )
    assert the_op(prof, "matmul").flops == 2 * b * m * n * k


def test_convolution_flops():
    # NHWC input 2x8x8x3, HWIO kernel 3x3x3x5, SAME padding: 2*out*kh*kw*cin.
    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    prof = xprof_lite.op_profile(conv, sds(2, 8, 8, 3), sds(3, 3, 3, 5))
    assert the_op(prof, "matmul").flops == 2 * (2 * 8 * 8 * 5) * (3 * 3 * 3)


def test_per_op_sum_matches_xla_whole_module_cost():
    def f(x, w):
        h = jnp.tanh(x @ w) + 1.0
        return jax.nn.softmax(h, axis=-1) * 2.0

    prof = xprof_lite.op_profile(f, sds(32, 64), sds(64, 48))
    assert prof.xla_cost is not None
    assert prof.total_flops == pytest.approx(prof.xla_cost["flops"])
    transcendentals = sum(op.transcendentals for op in prof.ops)
    assert transcendentals == pytest.approx(prof.xla_cost["transcendentals"])


def test_scan_body_ops_run_trip_count_times():
    def body(c, x):
        return jnp.tanh(c @ x), None

    def f(c, xs):
        return jax.lax.scan(body, c, xs)[0]

    prof = xprof_lite.op_profile(f, sds(32, 32), sds(5, 32, 32))
    op = the_op(prof, "matmul")
    assert op.executions == 5
    assert op.total_flops == 5 * 2 * 32**3


def test_named_scope_attention_is_its_own_category():
    def f(q, k):
        with jax.named_scope("attention"):
            return jax.nn.softmax(q @ k.T, axis=-1)

    prof = xprof_lite.op_profile(f, sds(16, 8), sds(16, 8))
    cats = prof.by_category()
    assert cats["attention"]["ops"] >= 1
    assert cats["attention"]["flops"] >= 2 * 16 * 16 * 8


def test_sliced_operand_counts_only_the_slice():
    prof = xprof_lite.op_profile(lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, 4) * 2.0,
                                 sds(1024, 256), jax.ShapeDtypeStruct((), jnp.int32))  # fmt: skip
    assert prof.total_bytes < 1024 * 256 * 4 / 10  # far less than the whole operand


GPU_LIKE_HLO = (pathlib.Path(__file__).parent / "data" / "gpu_like.hlo.txt").read_text()


def test_typed_operand_text_gemm_custom_call_and_categories():
    prof = xprof_lite.analyze_hlo(GPU_LIKE_HLO)
    assert prof.module == "jit_step"
    by_name = {op.name: op for op in prof.ops}
    # bookkeeping ops (parameter, get-tuple-element, tuple) are not listed
    assert set(by_name) == {"gemm", "ar", "t", "fusion", "start", "done"}
    assert by_name["start"].category == "collective"  # async-start of an all-gather
    assert by_name["gemm"].flops == 2 * 8 * 16 * 32
    assert by_name["gemm"].category == "matmul"
    assert by_name["ar"].category == "collective"
    assert by_name["ar"].flops == 0  # a collective's reduction is not counted as compute
    assert by_name["t"].category == "copy"
    assert by_name["fusion"].category == "elementwise"
    assert by_name["fusion"].flops == 8 * 16
    assert by_name["fusion"].bytes == 3 * 8 * 16 * 4


def test_shapes_and_bad_text():
    assert [str(s) for s in parse_shapes("(f32[2,3]{1,0}, bf16[<=4]{0}, s32[])")] == [
        "f32[2,3]",
        "bf16[4]",
        "s32[]",
    ]
    with pytest.raises(xprof_lite.Error, match="as_text"):
        parse_module("not hlo")
