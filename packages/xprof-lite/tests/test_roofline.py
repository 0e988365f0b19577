"""Roofline classification with a fixed peak table, the spec table, and the cached CPU peak."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from jaxstack import xprof_lite
from jaxstack.xprof_lite._src.peak import cache_dir, spec_peak

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


@pytest.mark.parametrize(
    ("kind", "flops", "bandwidth"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12, 3.35e12),
        ("NVIDIA H100 PCIe", 756e12, 2.0e12),
        ("NVIDIA H200", 989e12, 4.8e12),
        ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12),
        ("TPU v4", 275e12, 1.228e12),
        ("TPU v5 lite", 197e12, 0.819e12),
        ("TPU v5p", 459e12, 2.765e12),
        ("TPU v6 lite", 918e12, 1.64e12),
    ],
)
def test_spec_table(kind, flops, bandwidth):
    peak = spec_peak(kind)
    assert peak.flops_per_s == pytest.approx(flops)
    assert peak.bytes_per_s == pytest.approx(bandwidth)
    assert peak.source == "spec table"


def test_unknown_device_is_not_in_the_spec_table():
    assert spec_peak("cpu") is None
    assert spec_peak("Some Future Chip") is None


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSTACK_XPROF_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    first = xprof_lite.device_peak()
    assert first.source == "measured"
    assert first.flops_per_s > 1e8 and first.bytes_per_s > 1e7
    [cached] = list(tmp_path.glob("peak-*.json"))
    # The cache file is what later calls read: edit it and the edit comes back.
    edited = dataclasses.replace(first, flops_per_s=123.0)
    cached.write_text(json.dumps(edited.to_dict()))
    assert xprof_lite.device_peak().flops_per_s == 123.0
    assert xprof_lite.device_peak(refresh=True).flops_per_s != 123.0
