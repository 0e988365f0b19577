"""The trainer's settings in a post-training config: applied where an algorithm reads them,
refused where none does (a value that silently does nothing is an error)."""

import importlib.metadata
import json
import subprocess
import sys

import pytest
import yaml

from jaxstack import rl


@pytest.mark.parametrize(
    "algorithm,override,who",
    [
        ("sft", "train.attention=kernlib", "no algorithm"),
        ("grpo", "log.peak_flops=1e12", "no algorithm"),
        ("dpo", "data.prefetch=4", "no algorithm"),
        ("dpo", "train.grad_accum=2", "only sft"),
        ("grpo", "train.z_loss_weight=0.1", "only sft"),
        ("orpo", "data.packing=best_fit", "only sft"),
    ],
)
def test_a_setting_the_algorithm_ignores_is_refused(algorithm, override, who):
    key = override.partition("=")[0]
    with pytest.raises(
        rl.ConfigError,
        match=rf"^{key}=.* has no effect in jaxstack-rl "
        rf"{algorithm} \({who} reads it; .*\): remove it, or set ",
    ):
        rl.load_config(algorithm, None, [override])


def test_defaults_and_what_sft_reads_are_accepted():
    sft = rl.load_config("sft", None, ["train.grad_accum=2", "train.z_loss_weight=0.1"])
    assert (sft.train.grad_accum, sft.train.z_loss_weight) == (2, 0.1)
    dpo = rl.load_config("dpo", None, ["train.grad_accum=1", "data.prefetch=2"])  # the defaults
    assert dpo.train.grad_accum == 1


def test_the_schema_leaves_out_what_no_algorithm_reads():
    defs = rl.RLConfig.config_schema()["$defs"]
    assert "prefetch" not in defs["DataConfig"]["properties"]
    assert "attention" not in defs["TrainSection"]["properties"]
    assert {"packing", "seq_len"} <= set(defs["DataConfig"]["properties"])
    assert {"xla_flags", "compile_cache", "z_loss_weight"} <= set(
        defs["TrainSection"]["properties"]
    )


def test_a_saved_config_holds_only_the_keys_of_the_schema(tmp_path):
    config = rl.load_config("grpo", "tiny-grpo", [])
    config.save(tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    schema = rl.RLConfig.config_schema()
    for section, values in saved.items():
        entry = schema["properties"][section]
        if "$ref" in entry:
            known = schema["$defs"][entry["$ref"].rpartition("/")[2]]["properties"]
            assert set(values) <= set(known), section
            assert set(entry["default"]) <= set(known), section
    assert rl.load_config("grpo", str(tmp_path / "config.yaml"), []) == config


def test_sft_trains_with_the_z_loss_weight(tmp_path, tiny):
    def first_step(weight):
        run_dir = tmp_path / str(weight)
        overrides = [*tiny, "train.steps=1", f"train.z_loss_weight={weight}"]
        overrides += ["checkpoint.enabled=false", f"log.run_dir={run_dir}"]
        rl.sft(rl.load_config("sft", "tiny-sft", overrides))
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return next(r for r in map(json.loads, lines) if r["kind"] == "train")

    plain, weighted = first_step(0.0), first_step(0.5)
    assert (plain["z_loss"], plain["loss"]) == (0, pytest.approx(plain["cross_entropy"]))
    # the weighted z-loss: half the squared log-normaliser, log(Z) ~ log(256) at the start
    assert weighted["z_loss"] == pytest.approx(0.5 * 5.55**2, rel=0.1)
    expected = weighted["cross_entropy"] + weighted["z_loss"]
    assert weighted["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.skipif(
    tuple(int(x) for x in importlib.metadata.version("jaxlib").split(".")[:2]) < (0, 12),
    reason="the trainer adds XLA flags for jaxlib >= 0.12 only",
)
def test_the_cli_applies_xla_flags_and_the_compile_cache(tmp_path, tiny):
    dump, cache = tmp_path / "dump", tmp_path / "cache"
    args = ["sft", "--config", "tiny-sft", *tiny, "train.steps=1", "checkpoint.enabled=false"]
    args += [f"train.xla_flags=--xla_dump_to={dump}", f"train.compile_cache={cache}"]
    args += [f"log.run_dir={tmp_path / 'run'}"]
    code = "import sys; from jaxstack import rl; sys.exit(rl.main(sys.argv[1:]))"
    subprocess.run([sys.executable, "-c", code, *args], check=True, timeout=300)
    assert any(p.name.endswith(".before_optimizations.txt") for p in dump.iterdir())
    assert cache.is_dir()
