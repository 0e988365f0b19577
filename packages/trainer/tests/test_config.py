import json
import pathlib
import warnings

import pytest
import yaml

from jaxstack.trainer import Config, ConfigError, list_configs, load_config, parse_override


def test_presets_include_the_main_job_and_real_sizes():
    names = list_configs()
    for name in ("tiny", "tiny-moe", "test", "llama3-8b", "qwen2-7b", "mixtral-8x7b"):
        assert name in names


def test_overrides_apply_in_order_with_types_and_alias():
    c = load_config(
        "tiny",
        ["model.num_layers=2", "optim.lr=3e-4", "train.steps=70", "log.tensorboard=false"],
    )
    assert c.model["num_layers"] == 2
    assert c.optim["learning_rate"] == pytest.approx(3e-4)
    assert "lr" not in c.optim
    assert c.train.steps == 70
    assert c.log.tensorboard is False
    # an int where a float is declared is accepted and stored as float
    assert load_config("tiny", ["train.z_loss_weight=1"]).train.z_loss_weight == 1.0


def test_parse_override_values():
    assert parse_override("a.b=3e-4") == ("a.b", 3e-4)
    assert parse_override("a.b=null") == ("a.b", None)
    assert parse_override("a.b=hello") == ("a.b", "hello")
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("novalue")


def test_unknown_key_suggests_the_nearest():
    with pytest.raises(ConfigError, match=r"Did you mean 'train\.steps'\?"):
        load_config("tiny", ["train.stpes=3"])
    with pytest.raises(ConfigError, match=r"Did you mean 'model\.num_layers'\?"):
        load_config("tiny", ["model.num_layer=3"])
    with pytest.raises(ConfigError, match=r"Did you mean 'optim\.weight_decay'\?"):
        load_config("tiny", ["optim.weight_decy=0.1"])
    with pytest.raises(ConfigError, match="unknown key 'trian'"):
        load_config("tiny", ["trian.steps=3"])


def test_bad_preset_lists_the_presets():
    with pytest.raises(ConfigError) as e:
        load_config("tinny")
    assert "Did you mean 'tiny'" in str(e.value)
    for name in list_configs():
        assert name in str(e.value)


def test_wrong_types_and_values_are_named():
    with pytest.raises(
        ConfigError, match=r"train\.steps: Input should be a valid integer, got 'abc'"
    ):
        load_config("tiny", ["train.steps=abc"])
    with pytest.raises(
        ConfigError, match=r"train\.steps: Input should be greater than or equal to 1, got 0"
    ):
        load_config("tiny", ["train.steps=0"])
    with pytest.raises(
        ConfigError, match=r"data\.batch_size=8 is not a multiple of train\.grad_accum=3"
    ):
        load_config("tiny", ["data.batch_size=8", "train.grad_accum=3"])
    with pytest.raises(
        ConfigError, match=r"mesh axes must be positive or -1 \(at most one\), got \[-1, -1, 1, 1\]"
    ):
        load_config("tiny", ["mesh.data=-1", "mesh.fsdp=-1"])


def test_config_round_trips_through_yaml(tmp_path):
    c = load_config("test", ["model.num_layers=3", "optim.lr=0.01"])
    c.save(tmp_path / "config.yaml")
    again = load_config(str(tmp_path / "config.yaml"))
    assert again.to_dict() | {"name": c.name} == c.to_dict()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["num_layers"] == 3
    assert Config.from_dict(c.to_dict()) == c


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(
        ConfigError, match=r"nope\.yaml': cannot read the file \(No such file or directory\)"
    ):
        load_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.learning_rate=-1", r"^optim\.learning_rate: .* greater than or equal to 0, got -1"),
        ("optim.lr=abc", r"^optim\.learning_rate: Input should be a valid number, got 'abc'"),
        ("model.num_layers=two", r"^model\.num_layers: Input should be a valid integer, got 'two'"),
        ("model.num_layers=0", r"^model: num_layers=0 must be positive"),
        ("checkpoint.max_to_keep=0", r"^checkpoint\.max_to_keep: .* equal to 1, got 0"),
        ("eval.every=-5", r"^eval\.every: .* greater than or equal to 0, got -5"),
        ("eval.batches=0", r"^eval\.batches: .* greater than or equal to 1, got 0"),
        ("data.num_workers=-1", r"^data\.num_workers: .* greater than or equal to 0, got -1"),
        ("log.peak_flops=-3", r"^log\.peak_flops: Input should be greater than 0, got -3"),
        ("train.host_allocator=mmap", r"^train\.host_allocator: .* 'auto', 'retain' or 'system'"),
    ],
)
def test_every_bad_value_fails_at_load_time_naming_the_key(override, message):
    # the `test` preset warms up for 2 steps
    with pytest.raises(ConfigError, match=message):
        load_config("test", [override])


def test_lr_beside_learning_rate_is_one_setting_given_twice(tmp_path):
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 0.1\n  learning_rate: 0.2\n")
    with pytest.raises(
        ConfigError, match=r"^'optim\.lr' and 'optim\.learning_rate' are one setting"
    ):
        load_config(str(tmp_path / "c.yaml"))
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 0.1\n")
    for override in "optim.lr=0.3", "optim.learning_rate=0.3":  # either name replaces the file's
        assert load_config(str(tmp_path / "c.yaml"), [override]).optimizer.learning_rate == 0.3


def test_two_gradient_accumulations_are_refused():
    with pytest.raises(ConfigError, match=r"train\.grad_accum=2 and optim\.accumulate_steps=2"):
        load_config("test", ["train.grad_accum=2", "optim.accumulate_steps=2"])
    assert load_config("test", ["optim.accumulate_steps=2"]).optim["accumulate_steps"] == 2


def test_files_and_overrides_share_one_yaml_reader(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "optim:\n  learning_rate: 3e-4\ntrain:\n  z_loss_weight: 1E-4\n"
    )
    c = load_config(str(tmp_path / "c.yaml"))
    assert c.optim["learning_rate"] == 3e-4 and c.train.z_loss_weight == 1e-4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"model: [unclosed\n", r"is not valid YAML: .*bad\.yaml\", line 2"),
        (
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe",
            r"not valid YAML: unacceptable character #x0089",
        ),
        (b"train:\x00\n", r"is not valid YAML: unacceptable character #x0000"),
        (b"- model\n- optim\n", r"holds \['model', 'optim'\], not a mapping of sections"),
        (b"42\n", r"holds 42, not a mapping of sections"),
        (b"model: 3\n", r"^model: Input should be a valid dictionary, got 3$"),
        (b"train: [1, 2]\n", r"^train: Input should be a valid dictionary or .*, got \[1, 2\]$"),
    ],
)
def test_a_config_file_that_is_not_a_yaml_mapping_is_named(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as e:
        load_config(str(path))
    assert "\n" not in str(e.value)


def test_a_config_saved_by_trainer_0_6_still_loads():
    path = pathlib.Path(__file__).parent / "data" / "config-0.6.1.yaml"
    old = load_config(str(path))
    assert old.to_dict() | {"name": "test"} == load_config("test").to_dict()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.prefetch=0", r"^data\.prefetch: Input should be greater than or equal to 1, got 0$"),
        ("data.num_shards=0", r"^data\.num_shards: .* greater than or equal to 1, got 0$"),
        ("eval.every=-1", r"^eval\.every: Input should be greater than or equal to 0, got -1$"),
        ("train.donate=1", r"^train\.donate: Input should be a valid boolean, got 1$"),
        (
            "train.attention=flash",
            r"^train\.attention: Input should be 'xla' or 'kernlib', got 'flash'$",
        ),
        ("mesh.rules=3", r"^mesh\.rules: Input should be a valid dictionary, got 3$"),
        (
            "mesh.tensor=0",
            r"^mesh axes must be positive or -1 \(at most one\), got \[-1, 1, 0, 1\]$",
        ),
        (
            "model.preset=gpt9",
            r"^model\.preset: Input should be 'gemma-7b', .*'tiny'.*, got 'gpt9'$",
        ),
        ("optim.schedule.warmup_stesp=3", r"Did you mean 'optim\.schedule\.warmup_steps'\?"),
    ],
)
def test_schema_errors_name_the_key_the_value_and_the_range(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("test", [override])


PRESETS = pathlib.Path(__file__).parents[1] / "src/jaxstack/trainer/_src/presets"


def test_the_shipped_json_schema_is_the_one_the_cli_prints(capsys):
    from jaxstack.trainer import main

    assert main(["--print-schema"]) == 0
    printed = capsys.readouterr().out
    shipped = (PRESETS / "config.schema.json").read_text()
    assert printed == shipped, (
        "regenerate: jaxstack-train --print-schema > presets/config.schema.json"
    )
    schema = json.loads(shipped)
    assert schema["properties"]["train"]["$ref"] == "#/$defs/TrainSection"
    steps = schema["$defs"]["TrainSection"]["properties"]["steps"]
    assert (steps["type"], steps["default"], steps["minimum"]) == ("integer", 300, 1)
    assert "learning_rate" in schema["properties"]["optim"]["properties"]
    assert "tiny" in schema["properties"]["model"]["properties"]["preset"]["enum"]


def test_every_preset_names_the_schema_for_editors():
    for name in list_configs():
        first = (PRESETS / f"{name}.yaml").read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=config.schema.json", name


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "optim.name=adamw8bit",
            r"^optim\.name: Input should be 'adamw', 'adam', .*got 'adamw8bit'$",
        ),
        ("optim.learning_rate=.nan", r"^optim\.learning_rate: .* a finite number, got nan$"),
        (
            "optim.lr_multipliers={norm: -2}",
            r"^optim\.lr_multipliers\.norm: .* equal to 0, got -2$",
        ),
        ("optim.accumulate_steps=2.5", r"^optim\.accumulate_steps: .* valid integer, got 2\.5$"),
        ("optim.momentum=0.9", r"^optim: \['momentum'\] have no effect with optimizer 'adamw'"),
        ("optim.b1=1", r"^optim: b1 must be < 1 with 'adamw' \(only lion takes 1\), got 1$"),
        ('optim.frozen=["(x"]', r"^optim: frozen: '\(x' is not a valid regex"),
        ("optim.schedule=3", r"^optim\.schedule: Input should be a valid dictionary.*, got 3$"),
        ("optim.schedule.name=wsd", r"^optim: schedule 'wsd' needs decay_steps"),
        ("optim.schedule.decay_shape=exp", r"^optim\.schedule\.decay_shape: .* 'linear', 'cosine'"),
    ],
)
def test_optlib_models_check_the_optim_section_and_the_key_is_named(override, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config("test", [override])
    assert "\n" not in str(e.value)


def test_the_schedule_spans_the_run_unless_total_steps_is_set():
    c = load_config("test", ["train.steps=40"])
    assert "total_steps" not in c.optim.get("schedule", {})
    assert c.optimizer.schedule.total_steps == 40
    c = load_config("test", ["train.steps=40", "optim.schedule.total_steps=30"])
    assert c.optimizer.schedule.total_steps == 30
    assert Config.from_dict(c.to_dict()).optimizer == c.optimizer


def test_a_warmup_as_long_as_the_run_is_clamped_with_a_warning_and_a_ratio_is_a_share():
    with pytest.warns(UserWarning, match=r"warmup_steps=2 is not shorter than the 2-step run; "):
        c = load_config("test", ["train.steps=2"])
    assert c.optimizer.schedule.warmup == 0 and c.optim["schedule"]["warmup_steps"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warmup that fits, or a ratio, is left alone
        assert load_config("test", ["train.steps=3"]).optimizer.schedule.warmup == 2
        c = load_config("test", ["train.steps=40", "optim.schedule.warmup_ratio=0.25"])
    assert c.optimizer.schedule.warmup == 10


def test_an_override_may_set_a_top_level_key_and_a_bad_one_is_named():
    assert load_config("tiny", ["name=mine"]).name == "mine"
    with pytest.raises(ConfigError, match=r"^train: Input should be a valid dictionary.*got 3$"):
        load_config("tiny", ["train=3"])
    with pytest.raises(ConfigError, match=r"cannot set 'model\.preset\.x': 'preset' is a value"):
        load_config("tiny", ["model.preset.x=1"])
