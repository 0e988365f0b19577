"""Roofline classification against a fixed device peak (the peak itself: test_peak.py)."""

import jax
import jax.numpy as jnp
import pytest

from jaxstack import xprof_lite

# A fixed device: 100 TFLOP/s, 1 TB/s, so the ridge is at 100 FLOP/byte.
PEAK = xprof_lite.DevicePeak("test", flops_per_s=100e12, bytes_per_s=1e12)


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_large_matmul_is_compute_bound():
    n = 2048  # intensity 2n^3 / (3 * 4 n^2) = n / 6 ~ 341 FLOP/B
    prof = xprof_lite.op_profile(lambda a, b: a @ b, sds(n, n), sds(n, n))
    [point] = [p for p in xprof_lite.roofline(prof, PEAK) if p.category == "matmul"]
    assert point.intensity == pytest.approx(n / 6)
    assert point.bound == "compute"
    assert point.attainable_flops_per_s == PEAK.flops_per_s
    assert point.ideal_time_ns == pytest.approx(2 * n**3 / PEAK.flops_per_s * 1e9)


def test_large_elementwise_is_memory_bound():
    n = 4096  # x * 2 + 1: 2 FLOPs per element over 8 bytes moved
    prof = xprof_lite.op_profile(lambda x: x * 2.0 + 1.0, sds(n, n))
    [point] = xprof_lite.roofline(prof, PEAK)
    assert point.category == "elementwise"
    assert point.intensity == pytest.approx(0.25)
    assert point.bound == "memory"
    assert point.attainable_flops_per_s == pytest.approx(0.25 * PEAK.bytes_per_s)
    assert point.ideal_time_ns == pytest.approx(8 * n * n / PEAK.bytes_per_s * 1e9)


def test_achieved_fraction_from_a_measured_time():
    prof = xprof_lite.op_profile(lambda x: x * 2.0 + 1.0, sds(1024, 1024))
    op = prof.ops[0]
    ideal_ns = op.total_bytes / PEAK.bytes_per_s * 1e9
    op.time_ns = 4 * ideal_ns  # a quarter of the roofline
    [point] = xprof_lite.roofline(prof, PEAK)
    assert point.achieved_fraction == pytest.approx(0.25)
    assert point.achieved_bytes_per_s == pytest.approx(PEAK.bytes_per_s / 4)
