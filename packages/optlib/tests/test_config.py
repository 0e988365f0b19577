"""OptimizerConfig / ScheduleConfig: round trips and the bad-config errors of issue 4."""

import math
import warnings

import pytest

from jaxstack.optlib import (
    OPTIMIZERS,
    SCHEDULES,
    ConfigError,
    Error,
    OptimizerConfig,
    ScheduleConfig,
    UnmatchedRegexWarning,
    build_optimizer,
)

FULL = {
    "name": "adamw",
    "learning_rate": 3e-4,
    "schedule": {
        "name": "wsd",
        "warmup_steps": 10,
        "total_steps": 100,
        "decay_steps": 20,
        "final_lr_ratio": 0.1,
        "init_lr_ratio": 0.0,
        "decay_shape": "sqrt",
        "warmup_ratio": None,
    },
    "weight_decay": 0.1,
    "weight_decay_mask": ["norm", "bias"],
    "clip_norm": 1.0,
    "b1": 0.9,
    "b2": 0.95,
    "eps": 1e-8,
    "momentum": None,
    "nesterov": None,
    "accumulate_steps": 4,
    "ema_decay": 0.999,
    "skip_nonfinite": True,
    "max_consecutive_nonfinite": 5,
    "lr_multipliers": {"embed": 0.1},
    "frozen": ["^vision/"],
    "muon_exclude": None,
    "muon_dimension_numbers": {},
}


def test_dict_round_trip_is_exact():
    config = OptimizerConfig.from_dict(FULL)
    assert config.to_dict() == FULL
    assert OptimizerConfig.from_dict(config.to_dict()) == config
    assert config.schedule == ScheduleConfig("wsd", 10, 100, 0.1, 20, 0.0, "sqrt")


def test_yaml_round_trip_and_yaml_exponents(tmp_path):
    # YAML 1.1 reads `1e-3` (no dot) as a string; from_yaml reads it as YAML 1.2 does: a number.
    text = "name: lion\nlearning_rate: 1e-4\nweight_decay: 1e-2\nschedule: warmup_cosine\n"
    with pytest.raises(ConfigError, match="total_steps"):
        OptimizerConfig.from_yaml(text)
    text = text.replace(
        "schedule: warmup_cosine", "schedule: {name: inverse_sqrt, warmup_steps: 5}"
    )
    config = OptimizerConfig.from_yaml(text)
    assert config.learning_rate == 1e-4 and config.weight_decay == 1e-2
    assert config.schedule.name == "inverse_sqrt"
    with pytest.raises(ConfigError, match=r"^learning_rate: .* valid number, got '1e-4'$"):
        OptimizerConfig.from_dict({"learning_rate": "1e-4"})  # a string is not coerced
    path = tmp_path / "opt.yaml"
    path.write_text(OptimizerConfig.from_dict(FULL).to_yaml())
    assert OptimizerConfig.from_yaml(path) == OptimizerConfig.from_dict(FULL)
    assert OptimizerConfig.from_yaml(str(path)) == OptimizerConfig.from_dict(FULL)
    with pytest.raises(ConfigError, match=r"missing\.yaml': cannot read the file \(No such file"):
        OptimizerConfig.from_yaml(tmp_path / "missing.yaml")


def test_unknown_optimizer_lists_the_valid_ones():
    with pytest.raises(ConfigError) as error:
        OptimizerConfig.from_dict({"name": "adamw8bit"})
    message = str(error.value)
    assert message.startswith("name: ") and message.endswith("got 'adamw8bit'")
    assert all(name in message for name in OPTIMIZERS)
    assert isinstance(error.value, Error) and isinstance(error.value, ValueError)


def test_unknown_schedule_lists_the_valid_ones():
    with pytest.raises(ConfigError) as error:
        OptimizerConfig.from_dict({"schedule": {"name": "cosine"}})
    assert str(error.value).startswith("schedule.name: ") and "got 'cosine'" in str(error.value)
    assert all(name in str(error.value) for name in SCHEDULES)


def test_lr_is_short_for_learning_rate():
    assert OptimizerConfig.from_dict({"lr": 0.5}) == OptimizerConfig(learning_rate=0.5)
    assert OptimizerConfig(lr=0.5).to_dict()["learning_rate"] == 0.5
    with pytest.raises(ConfigError, match=r"^lr: Input should be greater than or equal to 0"):
        OptimizerConfig.from_dict({"lr": -1.0})
    with pytest.raises(ConfigError, match=r"^'lr' and 'learning_rate' are one setting; keep one$"):
        OptimizerConfig.from_dict({"lr": 0.5, "learning_rate": 0.1})


def test_unknown_field_lists_the_valid_fields():
    with pytest.raises(
        ConfigError, match=r"^unknown key 'rate'\. .* Valid keys here: .*learning_rate"
    ):
        OptimizerConfig.from_dict({"rate": 1e-3})
    with pytest.raises(ConfigError, match=r"^unknown key 'warmup'\. Did you mean 'warmup_steps'"):
        ScheduleConfig.from_dict({"name": "constant", "warmup": 3})
    with pytest.raises(
        ConfigError,
        match=r"^unknown key 'schedule\.warmup'\. Did you mean 'schedule\.warmup_steps'",
    ):
        OptimizerConfig.from_dict({"schedule": {"warmup": 3}})


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        (
            "learning_rate",
            -1e-3,
            "learning_rate: Input should be greater than or equal to 0, got -0.001",
        ),
        ("learning_rate", math.nan, "learning_rate: Input should be a finite number, got nan"),
        (
            "weight_decay",
            -0.1,
            "weight_decay: Input should be greater than or equal to 0, got -0.1",
        ),
        ("weight_decay", float("nan"), "weight_decay: Input should be a finite number, got nan"),
        ("clip_norm", 0.0, "clip_norm: Input should be greater than 0, got 0.0"),
        ("clip_norm", -1.0, "clip_norm: Input should be greater than 0, got -1.0"),
        ("b1", 1.0, "b1 must be < 1 with 'adamw' (only lion takes 1), got 1"),
        ("b2", -0.5, "b2: Input should be greater than or equal to 0, got -0.5"),
        ("eps", math.inf, "eps: Input should be a finite number, got inf"),
        ("ema_decay", 1.5, "ema_decay: Input should be less than 1, got 1.5"),
        (
            "accumulate_steps",
            0,
            "accumulate_steps: Input should be greater than or equal to 1, got 0",
        ),
        ("accumulate_steps", 2.5, "accumulate_steps: Input should be a valid integer, got 2.5"),
        (
            "lr_multipliers",
            {"norm": -2.0},
            "lr_multipliers.norm: Input should be greater than or equal to 0, got -2.0",
        ),
        ("lr_multipliers", {"norm": math.nan}, "lr_multipliers.norm: Input should be a finite"),
        ("skip_nonfinite", "yes", "skip_nonfinite: Input should be a valid boolean, got 'yes'"),
        ("learning_rate", "fast", "learning_rate: Input should be a valid number, got 'fast'"),
    ],
)
def test_bad_hyperparameters_are_errors(field, value, needle):
    """The field, pydantic's words for the range or the type, and the bad value, in one line."""
    with pytest.raises(ConfigError) as error:
        OptimizerConfig.from_dict({field: value})
    assert str(error.value).startswith(needle) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("schedule", "needle"),
    [
        ({"name": "warmup_cosine"}, "needs total_steps"),
        ({"name": "wsd", "total_steps": 100}, "needs decay_steps"),
        (
            {"name": "wsd", "total_steps": 100, "warmup_steps": 90, "decay_steps": 20},
            "exceeds total_steps",
        ),
        ({"name": "constant", "warmup_steps": -1}, r"warmup_steps: .* greater than or equal to 0"),
        ({"name": "warmup_linear", "total_steps": 10, "warmup_steps": 11}, "exceeds total"),
        ({"name": "warmup_cosine", "total_steps": 10, "final_lr_ratio": math.nan}, "finite"),
        ({"name": "warmup_cosine", "total_steps": 10, "decay_steps": 3}, "only used by 'wsd'"),
        (
            {"name": "wsd", "total_steps": 10, "decay_steps": 3, "decay_shape": "exp"},
            r"decay_shape: Input should be 'linear', 'cosine' or 'sqrt', got 'exp'",
        ),
    ],
)
def test_bad_schedules_are_errors(schedule, needle):
    with pytest.raises(ConfigError, match=needle):
        OptimizerConfig.from_dict({"schedule": schedule})


def test_fields_the_optimizer_ignores_are_errors():
    with pytest.raises(ConfigError, match=r"\['momentum'\] have no effect with optimizer 'adamw'"):
        OptimizerConfig.from_dict({"name": "adamw", "momentum": 0.9})
    with pytest.raises(ConfigError, match="no effect with optimizer 'sgd'"):
        OptimizerConfig.from_dict({"name": "sgd", "b1": 0.9})
    with pytest.raises(ConfigError, match="needs momentum"):
        OptimizerConfig.from_dict({"name": "sgd", "nesterov": True})
    with pytest.raises(ConfigError, match=r"\['muon_exclude'\] have no effect with .* 'adamw'"):
        OptimizerConfig.from_dict({"name": "adamw", "muon_exclude": ["embed"]})
    OptimizerConfig(name="lion", b1=1.0)  # lion's interpolation accepts b1 = 1


def test_bad_regexes_are_errors():
    with pytest.raises(ConfigError, match=r"^frozen: '\(unclosed' is not a valid regex"):
        OptimizerConfig.from_dict({"frozen": ["(unclosed"]})
    with pytest.raises(ConfigError, match=r"^weight_decay_mask: '\[z-a\]' is not a valid regex"):
        OptimizerConfig.from_dict({"weight_decay_mask": ["ok", "[z-a]"]})
    with pytest.raises(ConfigError, match=r"^lr_multipliers: '\(x' is not a valid regex"):
        OptimizerConfig.from_dict({"lr_multipliers": {"(x": 2.0}})


def test_unmatched_regexes_warn_naming_the_regex(params):
    config = OptimizerConfig(
        weight_decay=0.1,
        weight_decay_mask=["norm", "layernorm_typo"],
        lr_multipliers={"lm_haed": 2.0},
        frozen=["^embed/"],
    )
    with pytest.warns(UnmatchedRegexWarning) as record:
        build_optimizer(config, params)
    messages = sorted(str(w.message) for w in record)
    assert len(messages) == 2
    assert "lr_multipliers: regex 'lm_haed' matches no parameter path" in messages[0]
    assert "weight_decay_mask: regex 'layernorm_typo'" in messages[1]


def test_default_no_decay_list_does_not_warn_on_models_without_biases(params):
    params = {"w": params["lm_head"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_optimizer(OptimizerConfig(weight_decay=0.1), params)


def test_the_json_schema_carries_ranges_choices_and_descriptions():
    schema = OptimizerConfig.model_json_schema()
    props = schema["properties"]
    assert schema["additionalProperties"] is False
    assert props["learning_rate"]["minimum"] == 0 and props["learning_rate"]["default"] == 1e-3
    assert props["clip_norm"]["anyOf"][0]["exclusiveMinimum"] == 0
    assert props["name"]["enum"] == list(OPTIMIZERS)
    assert "peak learning rate" in props["learning_rate"]["description"]
    schedule = schema["$defs"]["ScheduleConfig"]["properties"]
    assert schedule["name"]["enum"] == list(SCHEDULES)
    assert schedule["warmup_steps"]["minimum"] == 0
    assert "warmup" in schedule["warmup_steps"]["description"]


def test_data_ways_in_raise_one_line_config_errors_and_constructors_stay_pydantic():
    """from_dict, from_yaml and replace raise ConfigError; the constructor and model_validate
    raise pydantic's ValidationError (a ValueError) located at the field."""
    from pydantic import ValidationError

    bad = {"schedule": {"name": "constant", "warmup_steps": "3"}}
    with pytest.raises(ConfigError, match=r"^schedule\.warmup_steps: .* valid integer, got '3'$"):
        OptimizerConfig.from_dict(bad)
    with pytest.raises(ConfigError, match=r"^momentum: Input should be less than 1, got 1\.0$"):
        OptimizerConfig(name="sgd").replace(momentum=1.0)
    for make in (lambda: OptimizerConfig(**bad), lambda: OptimizerConfig.model_validate(bad)):
        with pytest.raises(ValidationError) as error:
            make()
        assert error.value.errors()[0]["loc"] == ("schedule", "warmup_steps")
        assert isinstance(error.value, ValueError) and not isinstance(error.value, ConfigError)
    with pytest.raises(ValidationError) as error:  # a rule's ConfigError is the cause
        OptimizerConfig(b1=1)
    cause = error.value.errors()[0]["ctx"]["error"]
    assert isinstance(cause, ConfigError) and str(cause).startswith("b1 must be < 1 with 'adamw'")
    with pytest.raises(
        ConfigError, match=r"^OptimizerConfig: .* valid dictionary.*got \['adamw'\]"
    ):
        OptimizerConfig.from_dict(["adamw"])
    with pytest.raises(ConfigError, match=r"^b1 must be < 1 with 'adamw' \(only lion takes 1\)"):
        OptimizerConfig.from_dict({"b1": 1})
    with pytest.raises(TypeError, match="multiple values"):
        ScheduleConfig("wsd", name="constant")
    with pytest.raises(TypeError, match="takes 8 fields"):
        ScheduleConfig("wsd", 1, 2, 0.0, 1, 0.0, "sqrt", None, 3)


def test_one_regex_and_muon_axes_are_normalised():
    config = OptimizerConfig(
        name="muon",
        lr_multipliers={"embed": 0.1},
        frozen="^vision/",
        muon_exclude=[],
        muon_dimension_numbers={"q_proj": {"reduction_axis": 0, "output_axis": [1, 2]}, "x": None},
    )
    assert config.lr_multipliers == {"embed": 0.1}
    assert config.frozen == ("^vision/",) and config.muon_exclude_regexes == ()
    assert config.muon_dimension_numbers == {"q_proj": ((0,), (1, 2)), "x": None}
    assert OptimizerConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"numbers\.q: must be \[reduction_axes.*got \[0\]$"):
        OptimizerConfig.from_dict({"name": "muon", "muon_dimension_numbers": {"q": [0]}})
    with pytest.raises(ConfigError, match=r"numbers\.q\.1: .* at least 1 item.*got \(\)$"):
        OptimizerConfig.from_dict({"name": "muon", "muon_dimension_numbers": {"q": [0, []]}})
    with pytest.raises(ConfigError, match=r"\['muon_dimension_numbers'\] have no effect"):
        OptimizerConfig.from_dict({"muon_dimension_numbers": {"q": None}})
