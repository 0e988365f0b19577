"""`jaxstack-quant` on a run directory written by the main job, `jaxstack-train`."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxstack import ckptlib, nnlib
from jaxstack import quantlib as ql
from jaxstack.quantlib._src.cli import main

BIN = pathlib.Path(sys.executable).parent


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Two steps of a one-layer model: a real run directory in well under a minute."""
    run = tmp_path_factory.mktemp("runs") / "tiny"
    overrides = [
        "model.num_layers=1",
        "model.d_model=128",
        "model.num_heads=2",
        "model.num_kv_heads=2",
        "model.mlp_dim=256",
        "data.seq_len=64",
        "data.batch_size=2",
        "train.steps=2",
        "optim.schedule.warmup_steps=1",
        "eval.every=2",
        "eval.batches=1",
        "checkpoint.every=2",
        "checkpoint.async_save=false",
        "log.report=false",
        "log.tensorboard=false",
        "log.sample_tokens=0",
        "log.peak_flops=1e10",  # skip measuring the CPU's matmul peak
        f"log.run_dir={run}",
    ]
    subprocess.run([str(BIN / "jaxstack-train"), *overrides], check=True, capture_output=True)
    return run


def quant(*args):
    return subprocess.run(
        [str(BIN / "jaxstack-quant"), *map(str, args)], capture_output=True, text=True
    )


def test_ptq_then_eval_of_a_run_directory(run_dir, tmp_path, capsys):
    out = tmp_path / "w8a8"
    done = quant("ptq", run_dir, "--rules", "w8a8", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "-> " in done.stdout and sorted(p.name for p in out.iterdir()) == [
        "checkpoint",
        "model.safetensors",
        "quant.json",
    ]
    record = json.loads((out / "quant.json").read_text())
    assert record["step"] == 2 and record["rules"][0]["act_qtype"] == "int8"
    assert record["weight_bytes"]["quantized"] * 3.8 < record["weight_bytes"]["quantized_float"]

    results = {}
    for name, path in (("float", run_dir), ("w8a8", out)):
        assert main(["eval", str(path), "--batches", "2", "--batch-size", "2", "--json"]) == 0
        results[name] = json.loads(capsys.readouterr().out)
    assert results["float"]["tokens"] == results["w8a8"]["tokens"] > 0
    ratio = results["w8a8"]["perplexity"] / results["float"]["perplexity"]
    assert 0.98 < ratio < 1.02


def test_static_activation_rules_calibrate_on_training_batches(run_dir, tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "- {module_path: '.*', weight_qtype: int8, act_qtype: int8, act_static: true}\n"
    )
    assert main(["ptq", str(run_dir), "--rules", str(rules), "--out", str(tmp_path / "a")]) == 2
    assert "need calibration batches" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    args = ["ptq", str(run_dir), "--rules", str(rules), "--out", str(tmp_path / "b")]
    assert main([*args, "--calibration", "2"]) == 0
    tensors = ckptlib.load_safetensors(tmp_path / "b" / "model.safetensors", flat=True)
    assert float(tensors["layers.0.attn.q_proj.input_scale"]) > 0


def one_line_error(capsys, argv, out):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert not out.exists() and not any(out.parent.glob(f".{out.name}.tmp-*"))
    return captured.err


def test_bad_input_is_one_line_exit_2_and_nothing_written(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    err = one_line_error(capsys, ["ptq", str(tmp_path), "--rules", "int8", "--out", str(out)], out)
    assert "not a jaxstack-train run directory" in err

    bad = tmp_path / "bad.yaml"
    bad.write_text("- {module_path: '.*', weight_qtype: int8\n")
    err = one_line_error(capsys, ["ptq", str(run_dir), "--rules", str(bad), "--out", str(out)], out)
    assert "is not valid YAML" in err

    err = one_line_error(capsys, ["ptq", str(run_dir), "--rules", "int3", "--out", str(out)], out)
    assert "neither a preset" in err

    for name, state in (("no_params", {"w": np.ones(3)}), ("no_config", {"params": {"w": 1.0}})):
        with ckptlib.CheckpointManager(tmp_path / name, async_save=False) as manager:
            manager.save(1, state, metadata={"note": "not from jaxstack-train"})
    argv = ["ptq", str(tmp_path / "no_params"), "--rules", "int8", "--out", str(out)]
    assert "no leaves under 'params'" in one_line_error(capsys, argv, out)
    argv = ["ptq", str(tmp_path / "no_config"), "--rules", "int8", "--out", str(out)]
    assert "not a model checkpoint written by jaxstack-train" in one_line_error(capsys, argv, out)

    err = one_line_error(capsys, ["eval", str(tmp_path)], tmp_path / "nothing")
    assert "not a jaxstack-train run directory" in err


def test_binary_or_foreign_files_are_one_line_exit_2(tmp_path, capsys):
    """A file of the wrong kind names itself and the expected format instead of a traceback."""
    out = tmp_path / "out"
    binary = tmp_path / "rules.bin"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    err = one_line_error(
        capsys, ["ptq", str(tmp_path), "--rules", str(binary), "--out", str(out)], out
    )
    assert f"'{binary}' is not valid YAML" in err and "invalid start byte" in err

    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("int8\n")
    err = one_line_error(
        capsys, ["ptq", str(tmp_path), "--rules", str(scalar), "--out", str(out)], out
    )
    assert "got str 'int8'" in err and "a YAML list of mappings" in err

    for name, content in (("list", b"[1, 2]"), ("binary", bytes(range(128, 256)))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "quant.json").write_bytes(content)
    err = one_line_error(capsys, ["eval", str(tmp_path / "list")], tmp_path / "nothing")
    assert "a JSON list, not a 'jaxstack-quantlib' record" in err
    err = one_line_error(capsys, ["eval", str(tmp_path / "binary")], tmp_path / "nothing")
    assert "no readable quant.json" in err


def test_a_bad_rule_in_a_rules_file_names_the_file_and_the_rule(tmp_path, capsys):
    out = tmp_path / "out"
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "- {module_path: lm_head, weight_qtype: null}\n"
        "- {module_path: '.*', weight_qtype: int4, tile_size: 0}\n"
    )
    argv = ["ptq", str(tmp_path), "--rules", str(rules), "--out", str(out)]
    err = one_line_error(capsys, argv, out)
    assert f"error: {rules}: rule 1: tile_size: Input should be greater than 0, got 0" in err


def test_a_loaded_run_is_an_ordinary_mutable_model(run_dir):
    """QLoRA on a trained run: attaching adapters mutates the loaded model's modules."""
    src = ql.load_run(run_dir)
    assert src.step == 2 and src.seq_len == 64
    assert nnlib.apply_lora(src.model, r"attn/q_proj$", rank=2) == ["layers/0/attn/q_proj"]


def test_help_names_every_rules_preset():
    from jaxstack.quantlib._src import cli

    assert tuple(ql.PRESETS) == cli.PRESET_NAMES
