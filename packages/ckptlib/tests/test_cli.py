import importlib.metadata

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
