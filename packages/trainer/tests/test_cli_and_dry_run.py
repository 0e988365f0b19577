import subprocess
import sys

import pytest

from jaxstack.trainer import dry_run, list_configs, load_config, main
from jaxstack.trainer._src.cli import parse_mesh


def test_list_configs(capsys):
    assert main(["--list-configs"]) == 0
    assert capsys.readouterr().out.split() == list_configs()


def test_bad_preset_is_one_clear_line(capsys):
    assert main(["--config", "tinny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxstack-train: error: unknown config preset 'tinny'")
    assert "llama3-8b" in err and "Traceback" not in err


def test_unknown_override_suggests(capsys):
    assert main(["--config", "test", "optim.learning_rat=1e-3"]) == 2
    assert "Did you mean 'optim.learning_rate'?" in capsys.readouterr().err


def test_a_clamped_warmup_is_one_warning_line(capsys):
    assert main(["--config", "test", "--print-config", "train.steps=2"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "jaxstack-train: warning: optim.schedule.warmup_steps=2 is not shorter than the 2-step "
        "run; using 0 (a tenth of it). Set optim.schedule.warmup_ratio (a share of the run) or "
        "warmup_steps to choose."
    ]


def test_print_config_applies_overrides(capsys):
    assert main(["--config", "test", "--print-config", "model.num_layers=3", "optim.lr=0.5"]) == 0
    out = capsys.readouterr().out
    assert "num_layers: 3" in out and "learning_rate: 0.5" in out


def test_missing_data_path_is_a_clear_error(capsys, tmp_path):
    code = main(["--config", "test", f"data.path={tmp_path}/missing", f"log.run_dir={tmp_path}/r"])
    assert code == 2
    assert "missing' does not exist" in capsys.readouterr().err


def test_parse_mesh():
    assert parse_mesh("data=2,fsdp=4") == {"data": 2, "fsdp": 4, "tensor": 1, "expert": 1}
    with pytest.raises(Exception, match="axis=size"):
        parse_mesh("model=2")


def test_dry_run_small_model_compiles_and_reports_memory():
    report = dry_run(load_config("test"))
    assert report["compiled"] is True
    assert report["num_params"] > 0
    state = report["state_bytes_per_device"]
    # f32 params + two AdamW moments
    assert state >= 3 * 4 * report["num_params"]
    assert report["peak_bytes_per_device"] >= state
    # nnlib counts matmul parameters (not the embedding gather): between 3N and 7N per token
    tokens = 8 * 32
    assert 3 * report["num_params"] * tokens < report["model_flops_per_step"]
    assert report["model_flops_per_step"] < 7 * report["num_params"] * tokens


def test_the_dry_run_report_reads_for_a_tiny_model_and_a_large_one():
    """Parameters and FLOPs with an SI prefix: the tiny model printed '0.00 B' parameters and
    '0.0 TFLOP' per step."""
    from jaxstack.trainer._src.dry_run import format_report

    lines = format_report(
        {"num_params": 1_234_567, "model_flops_per_step": 2.5e9, "state_bytes_per_device": 2**30}
    ).splitlines()
    assert lines[1].split() == ["num_params", "1.23", "M"]
    assert lines[2].split() == ["model_flops_per_step", "2.5", "GFLOP"]
    assert lines[3].split() == ["state_bytes_per_device", "1.00", "GiB"]
    big = format_report({"num_params": 8.03e9, "model_flops_per_step": 5.1e16})
    assert big.splitlines()[1:] == [
        f"  {'num_params':32s} 8.03 G",
        f"  {'model_flops_per_step':32s} 51 PFLOP",
    ]


def test_dry_run_real_size_on_an_abstract_mesh():
    """llama3-8b over 256 fsdp devices: lowered without any device or allocation."""
    report = dry_run(load_config("llama3-8b"), {"fsdp": 256})
    assert report["compiled"] is False
    assert 7.9e9 < report["num_params"] < 8.1e9
    # params (f32) + AdamW moments, split 256 ways
    per_device = 12 * report["num_params"] / 256
    assert report["state_bytes_per_device"] == pytest.approx(per_device, rel=0.02)
    assert report["model_flops_per_step"] == pytest.approx(6 * 8.03e9 * 256 * 4096, rel=0.25)


def test_dry_run_batch_not_dividing_names_the_fix():
    from jaxstack.trainer import MeshError

    with pytest.raises(MeshError, match="multiple of 48"):
        dry_run(load_config("llama3-8b", ["data.batch_size=100"]), {"fsdp": 48})


@pytest.mark.slow
def test_cli_dry_run_compiles_real_size_on_fake_cpu_devices():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxstack.trainer._src.cli",
            "--config",
            "qwen2-7b",
            "--dry-run",
            "--mesh",
            "fsdp=4",
            "model.num_layers=2",
            "data.batch_size=4",
            "data.seq_len=512",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled                         True" in proc.stdout
    assert "peak_bytes_per_device" in proc.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["optim.learning_rate=-1"], "optim.learning_rate"),
        (["model.num_layers=two"], "model.num_layers"),
        (["checkpoint.max_to_keep=0"], "checkpoint.max_to_keep"),
        (["eval.every=-5"], "eval.every"),
        (["data.path={tmp}/empty.txt"], "empty.txt' is an empty file"),
        (["--config", "{tmp}/list.yaml"], "holds [1, 2], not a mapping of sections"),
        (["--config", "{tmp}/binary.yaml"], "not valid YAML: unacceptable character #x0089"),
    ],
)
def test_user_errors_are_one_line_exit_2_and_write_nothing(capsys, tmp_path, args, named):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x01")
    args = [a.format(tmp=tmp_path) for a in args]
    if "--config" not in args:
        args = ["--config", "test", *args]
    run_dir = tmp_path / "run"
    assert main([*args, f"--run-dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jaxstack-train: error: "), err
    assert named in err
    assert not run_dir.exists()


def test_report_error_answers_user_errors_in_one_line_and_raises_bugs(capsys):
    from jaxstack import nnlib
    from jaxstack.trainer import ConfigError, report_error

    assert report_error("prog", ConfigError("bad key")) == 2
    assert capsys.readouterr().err == "prog: error: bad key\n"
    assert report_error("prog", nnlib.ConfigError("bad model")) == 2  # a sibling's own error
    assert capsys.readouterr().err == "prog: error: ConfigError: bad model\n"
    with pytest.raises(KeyError):
        report_error("prog", KeyError("a bug"))
