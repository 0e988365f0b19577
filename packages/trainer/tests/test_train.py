"""End-to-end training on the `test` preset (a 2-layer d=32 model, seconds per run)."""

import math
import pathlib
import shutil

import jax
import numpy as np
import pytest

from jaxstack.trainer import DataError, load_config, main, read_jsonl, train
from jaxstack.xprof_lite import choose_host_allocator

STEP_KEYS = {"loss", "learning_rate", "grad_norm", "tokens_per_sec", "step_time_s", "mfu"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    config = load_config(
        "test",
        [
            f"log.run_dir={run_dir}",
            "train.steps=20",
            "log.report=true",
            "log.tensorboard=true",
            "log.peak_flops=1e11",
        ],
    )
    return config, train(config)


def test_loss_falls_and_every_step_is_logged(run):
    _config, result = run
    records = read_jsonl(result.run_dir / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, 21))
    for r in steps:
        assert set(r) >= STEP_KEYS
        assert r["tokens_per_sec"] == pytest.approx(8 * 32 / r["step_time_s"])
    # MFU is model FLOPs / (step time x the configured peak)
    r = steps[-1]
    assert r["mfu"] == pytest.approx(r["tokens_per_sec"] * result.summary["flops_per_token"] / 1e11)
    first = np.mean([r["loss"] for r in steps[:3]])
    last = np.mean([r["loss"] for r in steps[-3:]])
    assert last < first - 0.8, (first, last)
    # warmup then cosine decay: lr rises over the 2 warmup steps, then falls
    lrs = [r["learning_rate"] for r in steps]
    assert lrs[0] == 0.0 and max(lrs) == pytest.approx(3e-3) and lrs[-1] < lrs[5]


def test_eval_loss_and_perplexity(run):
    _, result = run
    records = read_jsonl(result.run_dir / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20]
    for r in evals:
        assert r["eval_perplexity"] == pytest.approx(math.exp(r["eval_loss"]))
        assert r["eval_tokens"] > 0
    assert evals[1]["eval_loss"] < evals[0]["eval_loss"]
    assert evals[1]["eval_loss"] < math.log(259)  # better than uniform over the byte vocabulary


def test_goodput_breakdown_sums_to_wall(run):
    _, result = run
    s = result.summary
    lost = sum(v for k, v in s.items() if k.startswith("lost_"))
    assert s["step_s"] + lost == pytest.approx(s["wall_s"], rel=1e-3)
    assert s["goodput"] == pytest.approx(s["step_s"] / s["wall_s"])
    for bucket in ("startup", "compile", "checkpoint", "eval"):
        assert s[f"lost_{bucket}_s"] > 0


def test_checkpoints_config_report_and_sample(run):
    from jaxstack import ckptlib

    config, result = run
    with ckptlib.CheckpointManager(result.run_dir / "checkpoints", read_only=True) as mgr:
        assert mgr.all_steps() == [10, 20]
        restored = mgr.restore()
    assert restored.metadata["config"] == config.to_dict()
    assert len(restored.data_state["shards"]) == 1
    saved = jax.tree.leaves(restored.state["params"])
    live = jax.tree.leaves(result.state["params"])
    assert all(np.array_equal(a, b) for a, b in zip(saved, live, strict=True))
    assert int(restored.state["step"]) == 20
    assert load_config(str(result.run_dir / "config.yaml")) == config
    html = (result.run_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert list((result.run_dir / "tb").glob("events.out.tfevents.*"))
    assert result.sample.startswith(config.log.sample_prompt)
    assert len(result.sample) > len(config.log.sample_prompt)


def test_resume_continues_exactly(tmp_path, run):
    """10 steps, then a fresh start in the same directory to step 20 == 20 steps straight."""
    _, straight = run
    overrides = [
        "train.steps=10",
        f"log.run_dir={tmp_path}",
        "log.sample_tokens=0",
        "optim.schedule.total_steps=20",  # the straight run's schedule
    ]
    first = train(load_config("test", overrides))
    assert first.step == 10
    second = train(load_config("test", [*overrides[1:], "train.steps=20"]))
    assert second.step == 20
    a = jax.tree.leaves(second.state["params"])
    b = jax.tree.leaves(straight.state["params"])
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    resumed = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    ref = [r for r in read_jsonl(straight.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in ref]


def test_missing_data_path_fails_before_anything_is_built(tmp_path):
    config = load_config(
        "test", [f"log.run_dir={tmp_path / 'run'}", f"data.path={tmp_path / 'nope.txt'}"]
    )
    with pytest.raises(DataError, match=r"nope\.txt.*does not exist"):
        train(config)
    assert not (tmp_path / "run").exists()


def test_custom_text_data(tmp_path):
    text = "def add(a, b):\n    return a + b\n\n" * 200
    (tmp_path / "corpus.txt").write_text(text)
    config = load_config(
        "test",
        [
            f"log.run_dir={tmp_path / 'run'}",
            f"data.path={tmp_path / 'corpus.txt'}",
            "train.steps=12",
            "optim.lr=1e-2",
            "checkpoint.enabled=false",
            "log.sample_tokens=0",
            "log.peak_flops=1000",  # far below what any step does
        ],
    )
    result = train(config)
    assert result.summary["final_loss"] < result.summary["first_loss"] - 1.0
    # MFU is against a peak no step exceeds: the fastest step so far becomes the peak
    mfus = [
        r["mfu"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"
    ]
    assert mfus[0] == 1.0 and max(mfus) == 1.0 and all(0 < m <= 1.0 for m in mfus)


def _damage(step_dir: pathlib.Path) -> None:
    """Truncates the largest file of a checkpoint to half: only its size gives it away."""
    biggest = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])


QUIET = ["eval.every=0", "log.sample_tokens=0", "log.report=false", "log.tensorboard=false"]


def test_damaged_checkpoints_never_crash_loop(run, tmp_path, capsys):
    """A copy of the 20-step run (checkpoints 10 and 20): damage step 20, rerun twice; then
    damage every step and rerun: each time the run completes, and the damage is said."""
    config, result = run
    shutil.copytree(result.run_dir / "checkpoints", tmp_path / "checkpoints")
    config = load_config("test", [*QUIET, f"log.run_dir={tmp_path}", "train.steps=20"])
    checkpoints = tmp_path / "checkpoints"
    _damage(checkpoints / "step_00000020")
    capsys.readouterr()
    # the first rerun falls back to step 10 and saves step 20 again; the second has nothing to do
    assert train(config).step == 20
    assert train(config).step == 20
    out = capsys.readouterr().out
    assert "resumed from checkpoint step 10" in out and "resumed from checkpoint step 20" in out
    [warning] = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert "step 20" in warning
    for step_dir in checkpoints.glob("step_*"):
        _damage(step_dir)
    again = train(config)
    out = capsys.readouterr().out
    assert again.step == 20
    assert "WARNING: starting from scratch because no checkpoint could be restored" in out
    assert again.summary["final_loss"] < again.summary["first_loss"]


def test_resuming_a_run_past_train_steps_is_one_line_exit_2(run, capsys):
    _, result = run
    before = sorted(p.name for p in result.run_dir.rglob("*"))
    args = ["--config", "test", f"--run-dir={result.run_dir}", "train.steps=10"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "already at step 20, past train.steps=10; raise train.steps" in err
    assert sorted(p.name for p in result.run_dir.rglob("*")) == before


def test_auto_host_allocator_is_measured_in_a_long_run_and_guessed_in_a_short_one(
    tmp_path, run, capsys
):
    _config, short = run
    assert short.summary["host_allocator"] == choose_host_allocator()
    assert "host_allocator_trial_step_s" not in short.summary
    config = load_config(
        "test",
        [f"log.run_dir={tmp_path}", "train.steps=40", "checkpoint.every=40", "eval.every=40"],
    )
    summary = train(config).summary
    trial = summary["host_allocator_trial_step_s"]
    assert {mode: len(times) for mode, times in trial.items()} == {"system": 4, "retain": 4}
    assert summary["host_allocator"] in trial
    assert f"host allocator: {summary['host_allocator']} (median step: " in capsys.readouterr().out
