import logging
import re
import stat
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib
from jaxstack.kernlib._src import dispatch, native, tuning
from jaxstack.kernlib.ops.ragged_paged_attention import base, ffi_cpu

IMPL = "ffi_cpu"
pytestmark = pytest.mark.skipif(
    isinstance(native.compiler(), str), reason="the CPU kernel is built with a C++ compiler"
)


def layout(batch, kv_layout):
    """The batch with its cache in `kv_layout` (make_batch builds page-major pages)."""
    q, k_pages, v_pages, *rest = batch
    if kv_layout == "head_major":
        k_pages, v_pages = k_pages.transpose(2, 0, 1, 3), v_pages.transpose(2, 0, 1, 3)
    return (q, k_pages, v_pages, *rest)


def test_mixed_prefill_and_decode_with_holes_and_padding(rpa_checks):
    rpa_checks.mixed_batch(IMPL)


@pytest.mark.parametrize("kv_layout", ["page_major", "head_major"])
@pytest.mark.parametrize(
    ("q_lens", "kv_lens"),
    [
        ([1] * 5, [1, 300, 17, 520, 64]),  # decodes: tiles of one row
        ([40, 1, 300, 1], [40, 700, 300, 33]),  # prefill chunks: tiles of 8 rows and a rest
    ],
)
@pytest.mark.parametrize(
    "options", [{}, {"sliding_window": 100}, {"logits_soft_cap": 2.0, "scale": 0.3}]
)
def test_long_contexts_give_the_reference_numbers(rpa_batch, kv_layout, q_lens, kv_lens, options):
    # many pages per row, a dead sequence, padding rows, -1 holes past each table's end
    batch = layout(rpa_batch(q_lens, kv_lens, page_size=8, live=len(q_lens) - 1), kv_layout)
    out = kernlib.ragged_paged_attention(
        *batch, implementation=IMPL, kv_layout=kv_layout, **options
    )
    want = base.reference(*batch, kv_layout=kv_layout, **options)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("head_dim", [64, 128, 24])  # the unrolled sizes, and any other
def test_every_head_dim_and_group_size(head_dim):
    # make_batch's head_dim is 16; the kernel has its own loops for 64 and 128
    (q, k, v, _, bt, cu, _), _ = base.example(
        dict(seqs=3, context=70, heads=6, kv_heads=2, head_dim=head_dim, q_len=3), "float32"
    )
    kv_lens = jnp.array([70, 3, 41], jnp.int32)
    out = kernlib.ragged_paged_attention(q, k, v, kv_lens, bt, cu, implementation=IMPL)
    want = base.reference(q, k, v, kv_lens, bt, cu)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)


def test_bfloat16_within_the_tolerance_of_float32(rpa_batch, rpa_compare):
    batch = rpa_batch([20, 1, 5, 1], [20, 37, 40, 90], dtype="bfloat16")
    rpa_compare(IMPL, batch, sliding_window=30)


def test_holes_in_block_tables_are_never_read(rpa_batch):
    batch = list(rpa_batch([3, 1], [17, 5]))
    out = kernlib.ragged_paged_attention(*batch, implementation=IMPL)
    tables = np.asarray(batch[4]).copy()
    tables[tables < 0] = 0  # a real page where the holes were
    batch[4] = tables
    again = kernlib.ragged_paged_attention(*batch, implementation=IMPL)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(again))


def test_the_cache_is_read_in_place_not_gathered():
    # The point of the custom call: the compiled program copies no pages (XLA's walk gathers
    # chunks of them); its operands are the cache arrays themselves.
    (q, k, v, kv_lens, bt, cu, _), _ = base.example(dict(seqs=8, context=200), "float32")
    hlo = (
        jax.jit(lambda *a: kernlib.ragged_paged_attention(*a, implementation=IMPL))
        .lower(q, k, v, kv_lens, bt, cu)
        .compile()
        .as_text()
    )
    ops = re.findall(r"= \S+\[[\d,]*\]\{[\d,]*\} ([\w-]+)\(", hlo)
    assert "custom-call" in ops and "gather" not in ops
    cache_shaped = rf"= f32\[{','.join(map(str, k.shape))}\]\S* ([\w-]+)\("
    assert set(re.findall(cache_shaped, hlo)) == {"parameter"}  # no copy of the cache


def test_cpu_prefers_the_custom_call(rpa_batch):
    batch = rpa_batch([1, 1], [5, 9])
    assert kernlib.which_implementation("ragged_paged_attention", *batch) == (IMPL, None)
    assert kernlib.which_implementation(
        "ragged_paged_attention", *batch[:3], *batch[3:], implementation="xla"
    ) == ("xla", None)


def test_other_dtypes_fall_back_to_xla(rpa_batch):
    batch = rpa_batch([1, 1], [5, 9], dtype="float16")
    assert "neither float32 nor bfloat16" in ffi_cpu.check(*batch)
    assert kernlib.which_implementation("ragged_paged_attention", *batch)[0] == "xla"


@pytest.fixture
def fresh_build(monkeypatch):
    """A build as a new process would do it: `native.library` forgotten, and `ffi_cpu.registered`
    uncached (XLA keeps the first registration of a target for the process, so the kernel
    registered by earlier tests stays what the other tests run)."""
    native.library.cache_clear()
    monkeypatch.setattr(ffi_cpu, "registered", ffi_cpu.registered.__wrapped__)
    yield
    native.library.cache_clear()


def test_without_a_compiler_dispatch_falls_back_to_xla_and_says_why(
    fresh_build, monkeypatch, rpa_batch, caplog
):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    dispatch._logged.clear()
    with caplog.at_level(logging.WARNING, logger="jaxstack.kernlib"):
        name, _ = kernlib.which_implementation("ragged_paged_attention", *rpa_batch([1], [5]))
    assert name == "xla"
    [line] = [r.getMessage() for r in caplog.records]
    assert "not using ffi_cpu" in line and "no C++ compiler '/nonexistent/c++'" in line


def test_a_failed_build_is_an_error_naming_the_command(fresh_build, monkeypatch, rpa_batch):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    with pytest.raises(kernlib.UnsupportedError, match=r"building ffi_cpu\.cc failed: false "):
        kernlib.ragged_paged_attention(*rpa_batch([1], [5]), implementation=IMPL)
    assert not list(tuning.cache_dir().glob("native/*"))  # no partial file left behind


def test_the_built_library_is_reused_not_rebuilt(fresh_build, monkeypatch, tmp_path):
    # a compiler that logs its command lines: the second process only asks its version
    log, cxx = tmp_path / "calls", tmp_path / "c++"
    cxx.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {native.compiler()[0]} "$@"\n')
    cxx.chmod(cxx.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(cxx))
    first = native.library(ffi_cpu.SOURCE)
    native.library.cache_clear()
    second = native.library(ffi_cpu.SOURCE)
    assert first._name == second._name and hasattr(second, ffi_cpu.SYMBOLS["float32"])
    calls = log.read_text().splitlines()
    assert len(calls) == 3 and calls[0] == calls[2] == "--version"
    assert "-march=native" in calls[1]
    assert [p.name for p in tuning.cache_dir().glob("native/*")] == [Path(first._name).name]
