"""Short runs: warmup clamped or given as a share, tiny presets, CLI ranges, key hints."""

import json
import pathlib
import warnings

import pytest

from jaxstack import rl

TINY_PRESETS = {f"tiny-{a}": a for a in rl.ALGORITHMS}


def test_a_preset_warmup_longer_than_a_short_run_is_clamped_with_a_warning():
    with pytest.warns(UserWarning, match=r"warmup_steps=20 is not shorter than the 20-step run"):
        config = rl.load_config("sft", "arithmetic-sft", ["train.steps=20"])
    assert config.optimizer.schedule.warmup == 2  # a tenth of the run
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warmup that fits is left alone, silently
        config = rl.load_config("sft", "arithmetic-sft", ["train.steps=100"])
    assert config.optimizer.schedule.warmup == 20


def test_warmup_ratio_is_a_share_of_the_run():
    config = rl.load_config(
        "sft", "arithmetic-sft", ["train.steps=50", "optim.schedule.warmup_ratio=0.2"]
    )
    assert config.optimizer.schedule.warmup == 10  # replaces the preset's 20
    for bad in ("1.5", "-0.1", "half"):
        with pytest.raises(rl.ConfigError, match=r"^optim\.schedule\.warmup_ratio: Input should"):
            rl.load_config("sft", "arithmetic-sft", [f"optim.schedule.warmup_ratio={bad}"])


def test_the_cli_warns_in_one_line(capsys, tmp_path):
    code = rl.main(["sft", "--config", "arithmetic-sft", "train.steps=5", "--print-config"])
    assert code == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "jaxstack-rl: warning: optim.schedule.warmup_steps=20 is not shorter than the 5-step "
        "run; using 0 (a tenth of it). Set optim.schedule.warmup_ratio (a share of the run) or "
        "warmup_steps to choose."
    ]


def test_key_hints_quote_the_whole_key(capsys):
    with pytest.raises(rl.ConfigError, match=r"Did you mean 'dpo\.beta'\?"):
        rl.load_config("dpo", None, ["dpo.beat=0.1"])
    with pytest.raises(rl.ConfigError, match=r"Did you mean 'train\.steps'\?"):
        rl.load_config("dpo", None, ["train.stepz=3"])  # the trainer's sections too
    assert rl.main(["dpo", "dpo.bta=0.2"]) == 2
    assert "Did you mean 'dpo.beta'?" in capsys.readouterr().err


def test_numeric_flags_are_checked_against_the_range_their_help_states(capsys):
    with pytest.raises(SystemExit) as exit_:
        rl.main(["recipe", "arithmetic", "--num-eval", "10"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--num-eval: 10 is below 500; give at least 500" in err
    from jaxstack.rl._src.cli import _parser

    help_ = _parser()._subparsers._group_actions[0].choices["recipe"].format_help()
    assert ">= 500" in help_


@pytest.mark.parametrize(
    "override,message",
    [
        ("rollout.top_k=0", r"^rollout\.top_k: Input should be greater than or equal to 1, got 0$"),
        ("ppo.gamma=1.5", r"^ppo\.gamma: Input should be less than or equal to 1, got 1\.5$"),
        ("lora.dropout=1.0", r"^lora\.dropout: Input should be less than 1, got 1\.0$"),
        ("lora.alpha=0", r"^lora\.alpha: Input should be greater than 0, got 0$"),
        ("ppo.value_clip_eps=-1", r"^ppo\.value_clip_eps: .* greater than or equal to 0, got -1$"),
    ],
)
def test_numeric_config_values_are_range_checked(override, message):
    with pytest.raises(rl.ConfigError, match=message):
        rl.load_config("ppo", None, [override])


def test_every_algorithm_has_a_tiny_preset_with_its_own_data():
    assert set(TINY_PRESETS) <= set(rl.list_presets())
    readers = {"sft": rl.read_sft_records, "dpo": rl.read_preference_records}
    readers.update(orpo=rl.read_preference_records, grpo=rl.read_prompts, ppo=rl.read_prompts)
    for preset, algorithm in TINY_PRESETS.items():
        config = rl.load_config(algorithm, preset)
        path = pathlib.Path(config.base.data.path)
        assert path.is_file() and path.parent.name == "data", preset
        assert len(readers[algorithm](path)) == 256
        assert config.base.train.steps * config.base.data.batch_size <= 3200  # a short run
    override = rl.load_config("sft", "tiny-sft", ["data.path=mine.jsonl"])
    assert override.base.data.path == "mine.jsonl"  # a user's data replaces the bundled one


@pytest.mark.slow
def test_tiny_sft_then_tiny_dpo_finish_from_the_cli(tmp_path, capsys):
    assert rl.main(["sft", "--config", "tiny-sft", "--run-dir", str(tmp_path / "sft")]) == 0
    model = tmp_path / "sft" / "model"
    assert (model / "tokenizer.json").is_file()
    args = ["dpo", "--config", "tiny-dpo", "--run-dir", str(tmp_path / "dpo"), f"init.hf={model}"]
    assert rl.main(args) == 0
    out = capsys.readouterr().out
    assert "done: step 40" in out and "margin" in out


def test_the_shipped_json_schema_is_the_one_the_cli_prints(capsys):
    presets = pathlib.Path(__file__).parents[1] / "src/jaxstack/rl/_src/presets"
    assert rl.main(["--print-schema"]) == 0
    shipped = (presets / "config.schema.json").read_text()
    assert capsys.readouterr().out == shipped, "regenerate: jaxstack-rl --print-schema > ..."
    schema = json.loads(shipped)
    gamma = schema["$defs"]["PpoSection"]["properties"]["gamma"]
    assert (gamma["minimum"], gamma["maximum"], gamma["default"]) == (0, 1, 1.0)
    assert schema["properties"]["algorithm"]["enum"] == list(rl.ALGORITHMS)
    assert "train" in schema["properties"]  # the trainer's sections too
    for name in rl.list_presets():
        first = (presets / f"{name}.yaml").read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=config.schema.json", name


def test_a_config_saved_by_rl_0_5_still_loads():
    old = rl.load_config(None, str(pathlib.Path(__file__).parent / "data" / "config-0.5.yaml"))
    assert (old.algorithm, old.data.path, old.roles.actor.devices) == ("grpo", "prompts.jsonl", [0])
    assert old.rewards == {
        "jaxstack.rl.arithmetic:exact_answer": 1.0,
        "jaxstack.rl.arithmetic:digit_credit": 1.0,
    }
    again = rl.RLConfig.from_dict(old.to_dict())
    assert again == old
