"""QuantRule: what to quantise, chosen by a regex over module paths; first match wins.

Module paths are the `/`-joined attribute paths of the model's module graph
(`layers/0/attn/q_proj`), matched with `re.search` like nnlib's surgery patterns. Only modules
that own a `kernel` (nnlib's Dense, Flax NNX's Linear and Einsum, or any module of that shape)
are candidates. A rule whose `weight_qtype` and `act_qtype` are both None quantises nothing:
placed first it excludes the modules it matches from the rules after it.
"""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
import re
import reprlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import yaml
from flax import nnx

from jaxstack.quantlib._src import calibration, qtypes
from jaxstack.quantlib._src.errors import QuantWarning, RuleError


@dataclasses.dataclass(frozen=True)
class QuantRule:
    """How to quantise the modules whose path matches `module_path`.

    Attributes:
      module_path: regex searched in the module path (`attn/(q|k|v)_proj$`, `.*`).
      weight_qtype: `int8`, `int4`, `fp8_e4m3`, `fp8_e5m2`, `nf4`, or None (keep float).
      act_qtype: the input activations' format (`int8`, `int4`, `fp8_*`), or None.
      tile_size: rows of the contracted axis sharing one weight scale (None: per channel).
      weight_calibration, act_calibration: `absmax`, `rms,K` or `percentile,P`.
      act_static: use one scale per module calibrated on sample batches instead of a
        per-token scale computed on the fly.
    """

    module_path: str = ".*"
    weight_qtype: str | None = "int8"
    act_qtype: str | None = None
    tile_size: int | None = None
    weight_calibration: str = "absmax"
    act_calibration: str = "absmax"
    act_static: bool = False

    def __post_init__(self) -> None:
        try:
            re.compile(self.module_path)
        except re.error as e:
            raise RuleError(f"module_path={self.module_path!r} is not a regex: {e}") from e
        if self.weight_qtype is not None:
            qtypes.get_qtype(self.weight_qtype, "weight_qtype")
        if self.act_qtype is not None:
            qtypes.get_qtype(self.act_qtype, "act_qtype", weights=False)
        calibration.parse(self.weight_calibration, "weight_calibration")
        calibration.parse(self.act_calibration, "act_calibration")
        tile = self.tile_size
        if tile is not None and (not isinstance(tile, int) or isinstance(tile, bool) or tile < 1):
            raise RuleError(f"tile_size={tile!r} must be a positive int or None")
        if self.act_static and self.act_qtype is None:
            raise RuleError("act_static=True needs an act_qtype to quantise activations to")

    @property
    def quantizes(self) -> bool:
        return self.weight_qtype is not None or self.act_qtype is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    if isinstance(items, dict) and "rules" in items:
        items = items["rules"]
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise RuleError(
            f"{source}: expected a non-empty list of rules (mappings), got "
            f"{type(items).__name__} {reprlib.repr(items)}; {RULES_FILE_EXAMPLE}"
        )
    known = {f.name for f in dataclasses.fields(QuantRule)}
    rules = []
    for i, item in enumerate(items):
        unknown = sorted(set(item) - known)
        if unknown:
            raise RuleError(
                f"{source}: rule {i} has unknown key(s) {unknown}; known: {sorted(known)}"
            )
        rules.append(QuantRule(**item))
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
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RuleError(
            f"{path} is not a YAML rules file (not UTF-8 text: {e.reason} at byte {e.start}); "
            f"{RULES_FILE_EXAMPLE}"
        ) from e
    except OSError as e:
        raise RuleError(f"{path}: cannot read the rules file ({e.strerror})") from e
    try:
        items = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RuleError(f"{path} does not parse as YAML: {str(e).splitlines()[0]}") from e
    return rules_from_dicts(items, str(path))


def iter_candidates(model: nnx.Module) -> Iterator[tuple[str, nnx.Module]]:
    """(path, module) for every module that owns a `kernel` variable."""
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and isinstance(getattr(node, "kernel", None), nnx.Variable):
            yield "/".join(str(k) for k in path), node


def match_rules(
    model: nnx.Module, rules: Sequence[QuantRule]
) -> list[tuple[str, nnx.Module, QuantRule]]:
    """(path, module, rule) for each candidate module; the first matching rule wins.

    A rule that matches no module is a QuantWarning naming the nearest module paths.
    """
    if not rules:
        raise RuleError("no quantisation rules given; pass at least one QuantRule")
    compiled = [(re.compile(r.module_path), r) for r in rules]
    candidates = list(iter_candidates(model))
    used: set[int] = set()
    matches = []
    for path, module in candidates:
        for i, (rx, rule) in enumerate(compiled):
            if rx.search(path):
                used.add(i)
                if rule.quantizes:
                    matches.append((path, module, rule))
                break
    paths = [p for p, _ in candidates]
    for i, rule in enumerate(rules):
        if i not in used:
            near = difflib.get_close_matches(rule.module_path, paths, n=3, cutoff=0.0)
            warnings.warn(
                f"quantisation rule {i} (module_path={rule.module_path!r}) matched no module"
                f"{' before an earlier rule' if _searches_any(rule, paths) else ''}; "
                f"nearest module paths: {near}",
                QuantWarning,
                stacklevel=3,
            )
    return matches


def _searches_any(rule: QuantRule, paths: list[str]) -> bool:
    return any(re.search(rule.module_path, p) for p in paths)
