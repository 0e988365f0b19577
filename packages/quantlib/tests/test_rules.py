"""Rules: matching by module path, first match wins, warnings and errors that say what to do."""

import pydantic
import pytest
import yaml
from flax import nnx

from jaxstack import quantlib as ql


def stored(model):
    """module path -> qtype of every weight stored quantised."""
    return {
        "/".join(str(k) for k in path[:-1]): var.get_value().qtype
        for path, var in nnx.iter_graph(model)
        if isinstance(var, ql.QuantizedWeight)
    }


def test_first_matching_rule_wins_and_a_none_rule_excludes(model):
    rules = [
        ql.QuantRule("lm_head", weight_qtype=None),
        ql.QuantRule(r"attn/q_proj$", "int4"),
        ql.QuantRule(r"layers/1/", "fp8_e4m3"),
        ql.QuantRule(".*", "int8"),
    ]
    q = stored(ql.quantize(model, ql.PtqProvider(rules)))
    assert "lm_head" not in q
    assert q["layers/0/attn/q_proj"] == "int4" and q["layers/1/attn/q_proj"] == "int4"
    assert q["layers/1/mlp/up_proj"] == "fp8_e4m3"
    assert q["layers/0/mlp/up_proj"] == "int8"
    assert len(q) == 2 * 7  # q, k, v, o, gate, up, down in each of two layers


def test_the_original_model_is_left_float(model):
    ql.quantize(model, ql.PtqProvider(ql.PRESETS["int8"]))
    assert stored(model) == {}


def test_a_rule_that_matches_nothing_warns_with_the_nearest_paths(model):
    rules = [ql.QuantRule("attn/q_prj$", "int8"), ql.QuantRule(".*", "int8")]
    with pytest.warns(ql.QuantWarning, match=r"rule 0 \(module_path='attn/q_prj\$'\)") as w:
        ql.quantize(model, ql.PtqProvider(rules))
    assert "attn/q_proj" in str(w[0].message)


def test_a_rule_shadowed_by_an_earlier_one_warns(model):
    rules = [ql.QuantRule(".*", "int8"), ql.QuantRule("mlp", "int4")]
    with pytest.warns(ql.QuantWarning, match="matched no module before an earlier rule"):
        ql.quantize(model, ql.PtqProvider(rules))


def one_rule_error(tmp_path, rule):
    """The RuleError of a rules file holding just `rule` (a mapping), less the file's name."""
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump([rule]))
    with pytest.raises(ql.RuleError) as error:
        ql.load_rules(path)
    message = str(error.value)
    assert message.startswith(f"{path}: rule 0: ") and "\n" not in message
    return message.removeprefix(f"{path}: rule 0: ")


def test_unknown_qtype_lists_the_supported_ones(tmp_path):
    assert one_rule_error(tmp_path, {"weight_qtype": "int3"}) == (
        "weight_qtype: Input should be 'int8', 'int4', 'fp8_e4m3', 'fp8_e5m2' or 'nf4', got 'int3'"
    )


@pytest.mark.parametrize(
    "rule, message",
    [
        (dict(act_qtype="nf4"), "act_qtype: Input should be 'int8', 'int4', 'fp8_e4m3' or "),
        (dict(weight_calibration="max"), "weight_calibration='max' is not a calibration method"),
        (dict(act_calibration="percentile,200"), "act_calibration='percentile,200' is not a"),
        (dict(tile_size=0), "tile_size: Input should be greater than 0, got 0"),
        (dict(act_static=True), "act_static=True needs an act_qtype"),
        (dict(module_path="(unclosed"), "module_path='(unclosed' is not a regex"),
    ],
)
def test_bad_rule_fields_are_named(tmp_path, rule, message):
    assert one_rule_error(tmp_path, rule).startswith(message)


def test_rules_from_yaml_and_presets(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "- {module_path: lm_head, weight_qtype: null}\n"
        "- {module_path: '.*', weight_qtype: int4, tile_size: 128}\n"
    )
    rules = ql.load_rules(path)
    assert rules == (
        ql.QuantRule("lm_head", weight_qtype=None),
        ql.QuantRule(".*", "int4", tile_size=128),
    )
    assert ql.load_rules("w8a8") == (ql.QuantRule(".*", "int8", act_qtype="int8"),)


@pytest.mark.parametrize(
    "text, message",
    [
        ("- {module_path: '.*', weight_qtype: int8\n", "is not valid YAML"),
        (
            "- {module_path: '.*', bits: 8}\n",
            r"rule 0: unknown key 'bits'\. Valid keys here: act_calibration, ",
        ),
        ("rules: 3\n", "expected a non-empty list of rules"),
    ],
)
def test_bad_rules_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ql.RuleError, match=message):
        ql.load_rules(path)


def test_a_rules_name_that_is_neither_preset_nor_file():
    with pytest.raises(ql.RuleError, match=r"neither a preset .*int8, w8a8, int4, nf4"):
        ql.load_rules("int9")


def test_a_bad_rule_in_a_file_names_the_file_and_the_rule_index(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "- {module_path: lm_head, weight_qtype: null}\n- {module_path: '.*', weight_qtype: int3}\n"
    )
    with pytest.raises(ql.RuleError) as error:
        ql.load_rules(path)
    message = str(error.value)
    assert message.startswith(f"{path}: rule 1: weight_qtype: Input should be 'int8', ")
    assert "'int8', 'int4', 'fp8_e4m3', 'fp8_e5m2' or 'nf4'" in message and "\n" not in message


@pytest.mark.parametrize(
    "rule, message",
    [
        (dict(tile_size=True), "tile_size: Input should be a valid integer, got True"),
        (dict(tile_size="128"), "tile_size: Input should be a valid integer, got '128'"),
        (dict(tile_size=64.0), "tile_size: Input should be a valid integer, got 64.0"),
        (
            dict(act_qtype="int8", act_static="yes"),
            "act_static: Input should be a valid boolean, got 'yes'",
        ),
        (dict(weight_qtype=8), "weight_qtype: Input should be 'int8', 'int4', "),
        (dict(module_path=3), "module_path: Input should be a valid string, got 3"),
        (
            dict(act_qtype="int3"),
            "act_qtype: Input should be 'int8', 'int4', 'fp8_e4m3' or 'fp8_e5m2', got 'int3'",
        ),
        (dict(bits=8), "unknown key 'bits'. Valid keys here: act_calibration, act_qtype, "),
    ],
)
def test_values_of_the_wrong_type_are_not_coerced(tmp_path, rule, message):
    assert one_rule_error(tmp_path, rule).startswith(message)


def test_a_rule_made_directly_raises_pydantic_errors_located_by_field():
    """The constructor is pydantic's: a ValidationError (a ValueError) per bad field, and a
    rule's own RuleError as the cause of its error."""
    with pytest.raises(pydantic.ValidationError) as error:
        ql.QuantRule(".*", "int3", tile_size=0)
    assert [e["loc"] for e in error.value.errors()] == [("weight_qtype",), ("tile_size",)]
    assert isinstance(error.value, ValueError)
    with pytest.raises(pydantic.ValidationError) as error:
        ql.QuantRule(act_static=True)
    cause = error.value.errors()[0]["ctx"]["error"]
    assert isinstance(cause, ql.RuleError) and "act_static=True needs an act_qtype" in str(cause)


def test_the_rule_schema_documents_every_field_and_the_formats():
    schema = ql.QuantRule.model_json_schema()
    properties = schema["properties"]
    assert schema["additionalProperties"] is False
    assert all(p.get("description") for p in properties.values()), properties
    weight = next(a for a in properties["weight_qtype"]["anyOf"] if "enum" in a)
    act = next(a for a in properties["act_qtype"]["anyOf"] if "enum" in a)
    assert weight["enum"] == list(ql.QTYPES)
    assert act["enum"] == [n for n in ql.QTYPES if n != "nf4"]
    tile = next(a for a in properties["tile_size"]["anyOf"] if a.get("type") == "integer")
    assert tile["exclusiveMinimum"] == 0


def test_rules_are_frozen_hashable_values_that_round_trip():
    rule = ql.QuantRule("attn/", "int4", act_qtype="int8", tile_size=64, act_calibration="rms,3")
    assert ql.QuantRule(**rule.to_dict()) == rule
    assert rule.to_dict() == {
        "module_path": "attn/",
        "weight_qtype": "int4",
        "act_qtype": "int8",
        "tile_size": 64,
        "weight_calibration": "absmax",
        "act_calibration": "rms,3",
        "act_static": False,
    }
    assert len({rule, ql.QuantRule(**rule.to_dict()), ql.QuantRule()}) == 2
    with pytest.raises(ValueError):
        rule.tile_size = 128
    with pytest.raises(TypeError, match="multiple values for keyword argument 'module_path'"):
        ql.QuantRule(".*", module_path="attn/")
    with pytest.raises(TypeError, match="QuantRule takes 7 fields"):
        ql.QuantRule(".*", "int8", None, None, "absmax", "absmax", False, 1)


def test_validating_a_rule_as_data_keeps_pydantic_errors_for_embedding_callers():
    """`model_validate` (and a model that holds rules) sees pydantic's structured errors."""
    rule = ql.QuantRule.model_validate({"module_path": "mlp", "weight_qtype": "nf4"})
    assert rule == ql.QuantRule("mlp", "nf4")
    with pytest.raises(pydantic.ValidationError) as error:
        ql.QuantRule.model_validate({"weight_qtype": "int3", "tile_size": 0})
    assert [e["loc"] for e in error.value.errors()] == [("weight_qtype",), ("tile_size",)]
