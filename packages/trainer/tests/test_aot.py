"""`--aot-topology`: the train step compiled for a TPU slice by the real TPU compiler, on CPU.

The compile tests need libtpu next to jax (`nox -s tpu_aot` installs it and sets
JAXSTACK_REQUIRE_LIBTPU=1, so there a missing libtpu fails instead of skipping).
"""

import importlib.util
import os
import subprocess
import sys

import pytest

from jaxstack.trainer import AotError, ConfigError, TpuSlice, aot_train_compile, load_config

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None and not os.environ.get("JAXSTACK_REQUIRE_LIBTPU"),
    reason="libtpu is not installed (nox -s tpu_aot installs it)",
)


def test_slice_names_as_cloud_tpu_spells_them():
    assert TpuSlice.parse("v5p-128") == TpuSlice("v5p-128", "v5p", "v5p:4x4x4", 64, "megacore")
    assert TpuSlice.parse("v6e-256").topology == "v6e:16x16"
    assert TpuSlice.parse("v5e-8").chips == 8
    with pytest.raises(ConfigError, match="v5p counts TensorCores"):
        TpuSlice.parse("tpu-8")
    with pytest.raises(ConfigError, match="choose one of v5p-8, v5p-16"):
        TpuSlice.parse("v5p-7")


@needs_libtpu
def test_train_step_compiles_for_a_v5e_slice_and_fits():
    report = aot_train_compile(load_config("test", ["data.batch_size=16"]), "v5e-4")
    assert report["chip"] == "TPU v5 lite"
    assert report["compiled"] is True and report["devices"] == 4
    assert report["hbm_bytes_per_chip"] == 16e9 and report["fits_hbm"] is True
    assert 0 < report["peak_bytes_per_device"] < 1e9
    assert report["model_flops_per_step_per_device"] == report["model_flops_per_step"] / 4
    assert report["predicted_step_seconds"] >= report["cost_model_seconds_loops_once"] > 0
    assert 0 < report["predicted_mfu"] < 1


@needs_libtpu
def test_cli_prints_memory_against_hbm_and_fails_clearly_when_it_does_not_fit():
    base = [sys.executable, "-m", "jaxstack.trainer._src.cli", "--config", "test"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    ok = subprocess.run(
        [*base, "--aot-topology", "v6e-4"], capture_output=True, text=True, timeout=600, env=env
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "TPU v6 lite" in ok.stdout and "HBM per chip" in ok.stdout
    assert "fits" in ok.stdout and "predicted MFU" in ok.stdout
    # 8 GiB of float32 embedding parameters plus AdamW moments cannot fit one 16 GB v5e chip
    big = ["model.vocab_size=2000000", "model.d_model=1024", "data.vocab_from_tokenizer=false"]
    bad = subprocess.run(
        [*base, "--aot-topology", "v5e-1", *big],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "error: the train step does not fit v5e-1 (TPU v5 lite)" in bad.stderr
    assert "exceeds available HBM (15.75G)" in bad.stderr and "data.batch_size" in bad.stderr


def test_a_report_over_the_chip_hbm_fails_naming_both_numbers():
    from jaxstack.trainer._src.aot import check_fits

    report = {"fits_hbm": False, "peak_bytes_per_device": 20 * 2**30, "hbm_bytes_per_chip": 16e9}
    with pytest.raises(AotError, match=r"20\.0 GiB per chip on v5e-4.*14\.9 GiB HBM"):
        check_fits({**report, "slice": "v5e-4", "chip": "TPU v5 lite"})


def test_without_libtpu_the_error_says_how_to_get_it():
    if importlib.util.find_spec("libtpu") is not None:
        pytest.skip("checks the error without libtpu")
    with pytest.raises(AotError, match="pip install libtpu"):
        aot_train_compile(load_config("test"), "v5e-4")
