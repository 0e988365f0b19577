"""QuantRule: what to quantise, chosen by a regex over module paths; presets and rules files.

A rule whose `weight_qtype` and `act_qtype` are both None quantises nothing: placed first it
excludes the modules it matches from the rules after it (`match.py` applies rules to a model:
first match wins).

A rule is a frozen pydantic model: its fields' types, ranges and docstrings give the checks and
the JSON Schema of a rules file entry (`QuantRule.model_json_schema()`). Made directly (keywords,
or positionally in field order) or by `QuantRule.model_validate` it raises pydantic's
`ValidationError`, each problem located by its field. Read from a rules file (`load_rules`, a
`quant.json`) it raises a one-line `RuleError`: the file, the rule's index, the field, pydantic's
message (the valid qtypes, the range or the type) and the bad value, or a rule's own sentence.
"""

from __future__ import annotations

import pathlib
import re
import reprlib
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from jaxstack import optlib
from jaxstack.quantlib._src import calibration
from jaxstack.quantlib._src.errors import RuleError

WeightQType = Literal["int8", "int4", "fp8_e4m3", "fp8_e5m2", "nf4"]
ActQType = Literal["int8", "int4", "fp8_e4m3", "fp8_e5m2"]


class QuantRule(optlib.PositionalConfigModel):
    """How to quantise the modules whose path matches `module_path` (strict, frozen, no unknown
    keys; fields by keyword or in order: `QuantRule(".*", "int4")`)."""

    error: ClassVar[type[Exception]] = RuleError

    module_path: str = ".*"
    """Regex searched in the module path (`attn/(q|k|v)_proj$`, `.*`); first match wins."""
    weight_qtype: WeightQType | None = "int8"
    """The weights' format (`QTYPES`), or None to keep them float."""
    act_qtype: ActQType | None = None
    """The input activations' format (nf4 is for weights only), or None to keep them float."""
    tile_size: int | None = Field(None, gt=0)
    """Rows of the contracted axis sharing one weight scale; None: one scale per channel."""
    weight_calibration: str = "absmax"
    """How the weights' bound is chosen: `absmax`, `rms,K` (K x root mean square) or
    `percentile,P` (0 < P <= 100)."""
    act_calibration: str = "absmax"
    """How the activations' bound is chosen, as `weight_calibration`."""
    act_static: bool = False
    """One scale per module calibrated on sample batches instead of a per-token scale computed
    on the fly (needs `act_qtype`)."""

    @field_validator("module_path")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as e:
            raise RuleError(f"module_path={value!r} is not a regex: {e}") from None
        return value

    @field_validator("weight_calibration", "act_calibration")
    @classmethod
    def _calibration(cls, value: str, info: Any) -> str:
        calibration.parse(value, info.field_name)
        return value

    @model_validator(mode="after")
    def _static_needs_act_qtype(self) -> QuantRule:
        if self.act_static and self.act_qtype is None:
            raise RuleError("act_static=True needs an act_qtype to quantise activations to")
        return self

    @property
    def quantizes(self) -> bool:
        return self.weight_qtype is not None or self.act_qtype is not None


PRESETS: dict[str, tuple[QuantRule, ...]] = {
    "int8": (QuantRule(".*", "int8"),),
    "w8a8": (QuantRule(".*", "int8", act_qtype="int8"),),
    "int4": (QuantRule(".*", "int4", tile_size=128),),
    "nf4": (QuantRule(".*", "nf4", tile_size=64),),
}
"""Named rule sets for `quantize(model, "int8")` and `--quant`: int8 weights (per channel),
w8a8 (int8 weights and activations), int4 (tiles of 128) and nf4 (tiles of 64), all layers."""


RULES_FILE_EXAMPLE = (
    "a rules file is a YAML list of mappings with QuantRule's keys, "
    "e.g. `- {module_path: 'attn/', weight_qtype: int8}`"
)


def rules_from_dicts(items: Any, source: str) -> tuple[QuantRule, ...]:
    """Rules from a parsed rules file (a list of mappings, or a mapping with a `rules` list);
    an error names `source` and the rule's index."""
    if isinstance(items, dict) and "rules" in items:
        items = items["rules"]
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise RuleError(
            f"{source}: expected a non-empty list of rules (mappings), got "
            f"{type(items).__name__} {reprlib.repr(items)}; {RULES_FILE_EXAMPLE}"
        )
    rules = []
    for i, item in enumerate(items):
        try:
            rules.append(QuantRule.from_dict(item))
        except RuleError as e:
            raise RuleError(f"{source}: rule {i}: {e}") from None
    return tuple(rules)


def load_rules(spec: str | pathlib.Path) -> tuple[QuantRule, ...]:
    """Rules from a preset name (`int8`, `w8a8`, `int4`, `nf4`) or a YAML file of rules."""
    if str(spec) in PRESETS:
        return PRESETS[str(spec)]
    path = pathlib.Path(spec)
    if not path.is_file():
        raise RuleError(
            f"rules {str(spec)!r} is neither a preset ({', '.join(PRESETS)}) nor a YAML file"
        )
    items = optlib.read_yaml_file(path, RuleError)
    return rules_from_dicts(items, str(path))
