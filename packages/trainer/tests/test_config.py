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
        ["model.num_layers=2", "optim.lr=3e-4", "train.steps=7", "log.tensorboard=false"],
    )
    assert c.model["num_layers"] == 2
    assert c.optim["learning_rate"] == pytest.approx(3e-4)
    assert "lr" not in c.optim
    assert c.train.steps == 7
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
    with pytest.raises(ConfigError, match=r"train\.'steps'"):
        load_config("tiny", ["train.stpes=3"])
    with pytest.raises(ConfigError, match=r"model\.'num_layers'"):
        load_config("tiny", ["model.num_layer=3"])
    with pytest.raises(ConfigError, match=r"optim\.'weight_decay'"):
        load_config("tiny", ["optim.weight_decy=0.1"])
    with pytest.raises(ConfigError, match="unknown config key 'trian'"):
        load_config("tiny", ["trian.steps=3"])


def test_bad_preset_lists_the_presets():
    with pytest.raises(ConfigError) as e:
        load_config("tinny")
    assert "Did you mean 'tiny'" in str(e.value)
    for name in list_configs():
        assert name in str(e.value)


def test_wrong_types_and_values_are_named():
    with pytest.raises(ConfigError, match=r"train\.steps must be int"):
        load_config("tiny", ["train.steps=abc"])
    with pytest.raises(ConfigError, match=r"train\.steps must be >= 1"):
        load_config("tiny", ["train.steps=0"])
    with pytest.raises(ConfigError, match=r"not divisible by train\.grad_accum=3"):
        load_config("tiny", ["data.batch_size=8", "train.grad_accum=3"])
    with pytest.raises(ConfigError, match="at most one mesh axis"):
        load_config("tiny", ["mesh.data=-1", "mesh.fsdp=-1"])


def test_config_round_trips_through_yaml(tmp_path):
    c = load_config("test", ["model.num_layers=3", "optim.lr=0.01"])
    c.save(tmp_path / "config.yaml")
    again = load_config(str(tmp_path / "config.yaml"))
    assert again.to_dict() | {"name": c.name} == c.to_dict()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["num_layers"] == 3
    assert Config.from_dict(c.to_dict()) == c


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
