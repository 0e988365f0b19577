"""The config machinery: strict pydantic sections, one YAML reader, dotted overrides, and errors
that name the key.

A config section is a `Section` (a frozen pydantic model that refuses unknown keys and converts
nothing but an int where a float is declared). Fields carry their type, default, range
(`Field(ge=1)`), choices (`Literal[...]`) and a docstring, so the JSON Schema, the reference
page and the error messages all come from the one declaration. `validate_config` turns
pydantic's first error into one line in the project's words: the dotted key, the bad value, the
allowed range or choices, or the nearest valid key.
"""

from __future__ import annotations

import difflib
import os
import pathlib
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from jaxstack.trainer._src.errors import ConfigError

ALIASES = {"optim.lr": "optim.learning_rate"}
"""Override keys accepted for another key (the short name people type)."""


class Section(BaseModel):
    """Base of every config section: strict types, no unknown keys, immutable.

    A field's docstring is its description (in the JSON Schema and the reference page). The
    error wording of a section's choices can be set per class with `choice_message` (a format
    string of `key`, `value` and `choices`).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True
    )
    choice_message: typing.ClassVar[str] = "{key} must be one of {choices}; got {value!r}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML/JSON-ready) that validates back to an equal config."""
        return self.model_dump(mode="json")


def validate_config(
    cls: type[BaseModel], tree: Any, prefix: str = "", error: type[Exception] = ConfigError
) -> Any:
    """`cls.model_validate(tree)`, raising `error` with one line about the first problem."""
    try:
        return cls.model_validate(tree)
    except ValidationError as e:
        raise error(explain(cls, e.errors()[0], prefix)) from None


def explain(cls: type[BaseModel], err: Mapping[str, Any], prefix: str = "") -> str:
    """One pydantic error as the project says it: key, bad value, and the range or the fix."""
    keys, field, parent, annotation = _walk(cls, err["loc"])
    key = ".".join(filter(None, [prefix, *keys]))
    value, kind, ctx = err.get("input"), err["type"], err.get("ctx") or {}
    if kind == "value_error":
        cause = ctx.get("error")
        if type(cause).__module__.startswith("jaxstack.") or not key:  # a complete message
            return str(cause if cause is not None else err["msg"])
        text = str(cause)
        return (
            f"{key} {text}, got {value!r}"
            if text.startswith("must")
            else f"{key}={value!r}: {text}"
        )
    if kind == "extra_forbidden":
        return unknown_key_message(key, parent.model_fields)
    if kind == "missing":
        return f"{key} is required"
    if kind in ("model_type", "dict_type") and (len(keys) == 1 or kind == "model_type"):
        return (
            f"config section {key!r} must be a mapping of keys to values, got {kind_of(value)}; "
            f"e.g. {key}.<key>=<value> or '{key}: {{key: value}}'"
        )
    if kind == "literal_error":
        choices = ", ".join(str(c) for c in _literals(annotation))
        message = getattr(parent, "choice_message", Section.choice_message)
        return message.format(key=key, value=value, choices=choices)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{key} must be {allowed_range(field, ctx)}, got {value}"
    if kind == "finite_number":
        return f"{key} must be a finite number, got {value}"
    if kind.endswith("_type") and field is not None:
        return f"{key} must be {type_names(annotation)}, got {value!r} ({type(value).__name__})"
    return f"{key}: {err['msg']} (got {value!r})"


def _walk(cls: type[BaseModel], loc: Iterable[Any]) -> tuple[list[str], Any, Any, Any]:
    """Along an error location: the config keys, the field it ends in, that field's model, and
    the annotation of the value at the end (a list's item type, a mapping's value type)."""
    keys: list[str] = []
    parent, field, annotation = cls, None, cls
    for part in loc:
        model = _model_of(annotation)
        if model is not None:
            if str(part) == model.__name__:  # a union member's tag
                continue
            parent, field = model, model.model_fields.get(str(part))
            keys.append(str(part))
            annotation = field.annotation if field is not None else None
        elif isinstance(part, str) and re.search(r"[\[\]]|^(int|str|float|bool|none)$", part):
            continue  # a union member's tag
        else:
            if isinstance(part, str):
                keys.append(part)
            inner = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(inner) == 1 and typing.get_origin(inner[0]):
                inner = list(typing.get_args(inner[0]))
            annotation = inner[-1] if inner else Any
    return keys, field, parent, annotation


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for member in (annotation, *typing.get_args(annotation)):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _literals(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [v for a in typing.get_args(annotation) for v in _literals(a)]


def type_names(annotation: Any) -> str:
    """`int | None` -> "int or None"; a mapping is "a mapping", a list "a list"."""
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        return " or ".join(type_names(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation) or annotation
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(annotation)))
    if origin in (dict, Mapping):
        return "a mapping"
    if origin in (list, tuple):
        return "a list"
    return getattr(origin, "__name__", str(origin))


def allowed_range(field: Any, ctx: Mapping[str, Any] | None = None) -> str:
    """A field's bounds in words: ">= 1", "> 0", "in [0, 1)"; "or null" where null is allowed.
    Bounds of a mapping's values or a list's items are in the error's `ctx` instead."""
    bounds = {}
    for meta in field.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if getattr(meta, name, None) is not None:
                bounds[name] = getattr(meta, name)
    if not bounds:
        words = dict(ge=">=", gt=">", le="<=", lt="<")
        return " ".join(f"{words[n]} {v}" for n, v in (ctx or {}).items() if n in words)
    low = [(n, bounds[n]) for n in ("ge", "gt") if n in bounds]
    high = [(n, bounds[n]) for n in ("le", "lt") if n in bounds]
    if low and high:
        (ln, lv), (hn, hv) = low[0], high[0]
        text = f"in {'[' if ln == 'ge' else '('}{lv}, {hv}{']' if hn == 'le' else ')'}"
    else:
        name, bound = (low or high)[0]
        text = f"{dict(ge='>=', gt='>', le='<=', lt='<')[name]} {bound}"
    hint = (
        (field.json_schema_extra or {}).get("hint")
        if isinstance(field.json_schema_extra, dict)
        else None
    )
    if hint:
        text += f" ({hint})"
    if type(None) in typing.get_args(field.annotation):
        text += " or null"
    return text


def unknown_key_message(key: str, valid: Iterable[str]) -> str:
    """ "unknown config key 'train.stpes'. Did you mean 'train.steps'? Valid keys here: ..."."""
    valid = sorted(set(valid))
    leaf = key.rsplit(".", 1)[-1]
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    near = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.5)
    hint = f" Did you mean {prefix + near[0]!r}?" if near else ""
    return f"unknown config key {key!r}.{hint} Valid keys here: {', '.join(valid)}"


def kind_of(value: Any) -> str:
    """How a wrong value is named in a message: "a list", "the int 42"."""
    if isinstance(value, list | tuple):
        return "a list"
    return f"the {type(value).__name__} {value!r}"


def section_of_dataclass(cls: type, name: str, **extra: Any) -> type[Section]:
    """A `Section` with the fields of a sibling's config dataclass (all optional) and `extra`
    keys of the given types, to check keys and plain types (int, float, bool, str, mappings) the
    way every other section is checked; the sibling's own constructor checks the rest."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {key: (kind | None, None) for key, kind in extra.items()}
    for field in cls.__dataclass_fields__:
        hint = hints[field]
        plain = all(
            a in (int, float, bool, str, type(None)) or typing.get_origin(a) in (dict, Mapping)
            for a in (
                typing.get_args(hint)
                if typing.get_origin(hint) in (types.UnionType, typing.Union)
                else (hint,)
            )
        )
        fields[field] = (hint if plain else Any, None)
    return create_model(name, __base__=Section, **fields)


def checked_keys(section: type[Section], values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The given keys of `values`, checked against `section` (values as validated)."""
    model = validate_config(section, dict(values), prefix)
    return {k: getattr(model, k) for k in values}


def json_schema(cls: type[BaseModel], title: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config class, for editors (yaml-language-server)."""
    schema = cls.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": title}


# ---- YAML: one reader for files and override values ----


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader reading floats as YAML 1.2 does: `3e-4` and `1E5` are numbers."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """The one YAML reader (safe: no Python objects), for files and overrides alike."""
    return yaml.load(text, Loader=_Loader)


def read_yaml_file(path: str | os.PathLike[str], error: type[Exception] = ConfigError) -> dict:
    """A YAML file holding a mapping of sections, or `error` saying what it holds instead."""
    path = pathlib.Path(path)
    fix = "pass a YAML mapping of sections (see --print-config) or a preset name"
    if not path.is_file():
        raise error(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"config file {str(path)!r} is not a text (UTF-8) file; {fix}") from None
    if "\x00" in text:
        raise error(f"config file {str(path)!r} is binary, not YAML; {fix}")
    try:
        tree = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise error(f"config file {str(path)!r} is not valid YAML{where}; {fix}") from None
    if tree is None:
        return {}
    if not isinstance(tree, Mapping):
        raise error(
            f"config file {str(path)!r} holds {kind_of(tree)}, not a mapping of sections; {fix}"
        )
    return dict(tree)


def dump_yaml(tree: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Writes `tree` as YAML atomically (a temporary name unique to this writer, then rename)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(tree)}.tmp")
    tmp.write_text(yaml.safe_dump(dict(tree), sort_keys=False))
    tmp.replace(path)


# ---- dotted overrides ----


def apply_overrides(tree: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Sets each `section.key=value` override in a config tree, in order; returns the tree."""
    for item in overrides:
        key, value = parse_override(item)
        parts = key.split(".")
        if len(parts) < 2:
            raise ConfigError(
                f"override key {key!r} needs a section, e.g. model.{key} or train.{key}"
            )
        node = tree
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"cannot set {key!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return tree


def parse_override(item: str) -> tuple[str, Any]:
    """`"optim.lr=3e-4"` -> `("optim.learning_rate", 0.0003)`; values parse as YAML scalars."""
    if "=" not in item or item.startswith("="):
        raise ConfigError(
            f"override {item!r} is not of the form section.key=value, "
            "e.g. model.num_layers=4 or optim.lr=3e-4"
        )
    key, raw = item.split("=", 1)
    key = ALIASES.get(key.strip(), key.strip())
    try:
        return key, load_yaml(raw.strip())
    except yaml.YAMLError:
        return key, raw.strip()
