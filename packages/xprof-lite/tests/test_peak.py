"""Device peaks: the spec table checked against independent hardware figures, the measured and
cached CPU peak."""

import dataclasses
import json

import pytest

from jaxstack import xprof_lite
from jaxstack.xprof_lite._src.peak import cache_dir

# bf16 dense FLOP/s from the architecture, not the data sheet: units x clock x FLOPs per unit and
# clock. NVIDIA: SMs x boost clock x dense fp16/bf16 tensor FLOPs per SM per clock (Hopper 4096,
# Ampere 2048, Ada 1024: the architecture whitepapers); TPU: MXUs x (MXU edge)^2 x 2 x clock
# (Google's system architecture pages).
ARCHITECTURE = [
    ("NVIDIA H100 80GB HBM3", 132 * 1.83e9 * 4096),
    ("NVIDIA H200", 132 * 1.83e9 * 4096),
    ("NVIDIA H100 PCIe", 114 * 1.62e9 * 4096),
    ("NVIDIA A100-SXM4-80GB", 108 * 1.41e9 * 2048),
    ("NVIDIA L4", 58 * 2.04e9 * 1024),
    ("NVIDIA A10G", 72 * 1.71e9 * 1024),
    ("TPU v4", 2 * 4 * 128**2 * 2 * 1.05e9),
    ("TPU v5 lite", 4 * 128**2 * 2 * 1.5e9),
    ("TPU v5p", 2 * 4 * 128**2 * 2 * 1.75e9),
    ("TPU v6 lite", 4 * 256**2 * 2 * 1.75e9),
]
# HBM bytes/s: bus width (bits) x data rate (Gbit/s per pin) / 8.
MEMORY = [
    ("NVIDIA H100 80GB HBM3", 5120 * 5.23e9 / 8),
    ("NVIDIA H200", 6144 * 6.25e9 / 8),
    ("NVIDIA A100-SXM4-80GB", 5120 * 3.186e9 / 8),
]


@pytest.mark.parametrize(("kind", "flops"), ARCHITECTURE)
def test_spec_bf16_peak_matches_the_architecture(kind, flops):
    peak = xprof_lite.spec_peak(kind)
    assert peak.flops_per_s == pytest.approx(flops, rel=0.01)
    assert peak.source.startswith("spec table: ")


@pytest.mark.parametrize(("kind", "bandwidth"), MEMORY)
def test_spec_bandwidth_matches_the_memory_bus(kind, bandwidth):
    assert xprof_lite.spec_peak(kind).bytes_per_s == pytest.approx(bandwidth, rel=0.01)


def test_float32_is_the_rate_xla_uses_at_default_precision():
    # NVIDIA Ampere and later run f32 matmuls on TF32 tensor cores at half the bf16 rate;
    # TPUs run them as bf16 passes, so a float32 step can reach the bf16 peak there.
    for row in xprof_lite.SPEC_TABLE:
        peak = xprof_lite.spec_peak(row.match)
        if row.match.startswith(("h", "gh", "b2", "a1", "a10", "l4")):
            assert peak.flops_for("float32") == pytest.approx(peak.flops_per_s / 2, rel=0.03)
        elif row.match.startswith("tpu"):
            assert peak.flops_for("float32") == peak.flops_per_s


def test_every_row_is_reachable_and_names_its_source():
    for row in xprof_lite.SPEC_TABLE:
        assert xprof_lite.spec_peak(row.match).source == f"spec table: {row.source}"
    assert xprof_lite.spec_peak("cpu") is None
    assert xprof_lite.spec_peak("Some Future Chip") is None


def test_cpu_peak_is_measured_once_cached_and_never_lowered(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSTACK_XPROF_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    first = xprof_lite.device_peak()
    assert first.source == "measured"
    assert first.flops_per_s > 1e8 and first.flops_per_s_f32 > 1e8 and first.bytes_per_s > 1e7
    [cached] = list(tmp_path.glob("peak-*.json"))
    # The cache file is what later calls read: edit it and the edit comes back.
    edited = dataclasses.replace(first, flops_per_s_f32=1e18)
    cached.write_text(json.dumps(edited.to_dict()))
    assert xprof_lite.device_peak().flops_per_s_f32 == 1e18
    # A new measurement (lower than 1e18) never lowers a cached number.
    assert xprof_lite.device_peak(refresh=True).flops_per_s_f32 == 1e18
    assert list(tmp_path.glob("*.tmp")) == []


def test_a_peak_measured_on_a_busy_machine_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSTACK_XPROF_CACHE_DIR", str(tmp_path))
    first = xprof_lite.device_peak()
    [cached] = list(tmp_path.glob("peak-*.json"))
    quiet_but_low = dataclasses.replace(first, flops_per_s_f32=123.0, load_per_core=0.1)
    cached.write_text(json.dumps(quiet_but_low.to_dict()))
    assert xprof_lite.device_peak().flops_per_s_f32 == 123.0  # quiet: trusted as it is
    busy_and_low = dataclasses.replace(first, flops_per_s_f32=123.0, load_per_core=9.0)
    cached.write_text(json.dumps(busy_and_low.to_dict()))
    again = xprof_lite.device_peak()
    assert again.flops_per_s_f32 > 123.0
