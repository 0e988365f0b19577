import importlib.metadata
import subprocess
import sys

import pytest
from ckptlib_testutil import make_state

from jaxstack.ckptlib import CheckpointManager, load_safetensors
from jaxstack.ckptlib._src.cli import main


@pytest.fixture
def run_dir(tmp_path):
    with CheckpointManager(tmp_path / "run") as mgr:
        mgr.save(10, make_state(1), metrics={"loss": 2.5})
        mgr.save(20, make_state(2), metrics={"loss": 1.25})
    return tmp_path / "run"


def test_console_script_is_declared():
    scripts = importlib.metadata.entry_points(group="console_scripts")
    [entry] = [e for e in scripts if e.name == "jaxstack-ckpt"]
    assert entry.load() is main


def test_ls_and_inspect(run_dir, capsys):
    assert main(["ls", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "10  sizes ok" in out and "20  sizes ok" in out and "loss=1.25" in out
    assert main(["inspect", str(run_dir), "--step", "10"]) == 0
    out = capsys.readouterr().out
    assert "step 10" in out
    assert "params/embed" in out and "(32, 16)" in out and "2.0 KiB" in out
    assert "opt_state/0/nu/norm/scale" in out and "bfloat16" in out


def test_verify_exit_codes(run_dir, capsys):
    assert main(["verify", str(run_dir)]) == 0
    assert "step_00000010: ok" in capsys.readouterr().out
    (run_dir / "step_00000020" / "data_state.json").write_text("{}")
    assert main(["verify", str(run_dir)]) == 1
    assert "step_00000020: DAMAGED" in capsys.readouterr().out


def test_export_and_clear_errors(run_dir, tmp_path, capsys):
    out = tmp_path / "p.safetensors"
    assert main(["export-safetensors", str(run_dir), str(out), "--step", "10"]) == 0
    assert set(load_safetensors(out)) == {"embed", "layers", "norm"}
    everything = tmp_path / "all.safetensors"
    assert main(["export-safetensors", str(run_dir), str(everything), "--all"]) == 0
    back = load_safetensors(everything)
    assert set(back) == {"params", "opt_state", "step"} and back["step"].shape == ()
    assert int(back["step"]) == 2 and back["opt_state"]["0"]["count"].shape == ()
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "missing does not exist" in capsys.readouterr().err
    assert main(["verify", str(run_dir), "--step", "7"]) == 2
    assert "no checkpoint of step 7" in capsys.readouterr().err


def test_verify_of_a_folder_without_checkpoints_fails_and_points_at_them(run_dir, capsys):
    parent = run_dir.parent  # e.g. the run directory instead of its checkpoints folder
    assert main(["verify", str(parent)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"no checkpoint in {parent}" in err and str(run_dir) in err


@pytest.mark.parametrize("command", ["ls", "ls --verify", "inspect", "inspect --step 10", "verify"])
def test_every_command_on_a_folder_without_checkpoints_exits_2(tmp_path, capsys, command):
    """A folder of other files is one line on stderr saying what a checkpoint folder holds."""
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "logs").mkdir()
    assert main([*command.split(), str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert f"no checkpoint in {tmp_path}: a checkpoint folder holds step_NNNNNNNN" in captured.err
    assert main([*command.split(), str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt is a file, not a folder" in capsys.readouterr().err


def test_export_of_a_folder_without_checkpoints_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "p.safetensors"
    assert main(["export-safetensors", str(tmp_path), str(out)]) == 2
    assert f"no checkpoint in {tmp_path}: a checkpoint folder" in capsys.readouterr().err
    assert not out.exists()


def test_an_unreadable_manifest_is_damage_not_a_traceback(run_dir, capsys):
    (run_dir / "step_00000020" / "manifest.json").write_bytes(bytes(range(128, 256)))
    assert main(["inspect", str(run_dir), "--step", "20"]) == 2
    err = capsys.readouterr().err
    assert "no readable manifest" in err and "step_00000020: 'utf-8' codec can't decode" in err
    assert main(["inspect", str(run_dir)]) == 0
    assert "step 10" in capsys.readouterr().out
    assert main(["ls", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "10  sizes ok" in out and "20  DAMAGED" in out and "unreadable manifest" in out


def test_ls_says_what_it_checked_and_verify_finds_flipped_bits(run_dir, capsys):
    from test_integrity import flip_a_byte

    flip_a_byte(run_dir / "step_00000020")
    assert main(["ls", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "sizes only" in out and "--verify" in out
    assert "20  ok" not in out and "20  sizes ok" in out
    assert main(["ls", "--verify", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "10  ok" in out and "20  DAMAGED" in out and "sha256" in out


def test_help_loads_neither_numpy_nor_jax():
    # `--help` of every jaxstack CLI should answer in well under 1 s (benchmarks/cli).
    code = (
        "import sys\n"
        "from jaxstack.ckptlib._src.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print(sorted(m for m in ('numpy', 'jax', 'orbax') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
