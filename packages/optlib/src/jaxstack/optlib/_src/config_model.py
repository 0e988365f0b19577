"""The config machinery every jaxstack package shares: one pydantic base and one YAML reader.

optlib is the lowest package with a config, so the pieces live here once and the trainer, rl
and quantlib build their own configs on them:

- `ConfigModel`, a pydantic model that is strict (no bool for a number, no "yes" for true, no
  NaN), frozen and closed (an unknown key is an error); a field's type, default, range and
  docstring are its schema. `from_dict` words pydantic's first error as one line: the dotted
  key, pydantic's own message (it states the range, the choices or the type) and the bad value;
  for an unknown key, the nearest valid one; for a rule of the model, its own sentence.
- `load_yaml` and `read_yaml_file`: PyYAML's safe loader reading floats as YAML 1.2 does
  (`3e-4` is a number, not the string YAML 1.1 makes of it), and a file's problems as one line.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from jaxstack.optlib._src.errors import ConfigError


class ConfigModel(BaseModel):
    """Base of a config: strict, frozen, no unknown keys, no NaN.

    Subclasses set `error`, the exception `from_dict` raises (a package's own ConfigError).
    """

    model_config = ConfigDict(
        strict=True, frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )
    error: ClassVar[type[Exception]] = ConfigError

    @classmethod
    def from_dict(cls, data: Any, prefix: str = "") -> Any:
        """From plain data (as parsed from JSON or YAML), raising `cls.error` with one line about
        the first problem; keys are named under `prefix` (the section `data` is, if any)."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise cls.error(_one_line(cls, e.errors()[0], prefix)) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML/JSON-ready: lists, not tuples) that `from_dict` reads back equal."""
        return self.model_dump(mode="json")

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed, checked again as `from_dict` checks."""
        return self.from_dict({**dict(self), **changes})


class PositionalConfigModel(ConfigModel):
    """A ConfigModel whose fields may also be given in their order (`QuantRule(".*", "int4")`).

    A custom `__init__` makes pydantic run the model's validators twice per validation, so
    only the small configs people write in code take it (not the trainer's sections).
    """

    def __init__(self, *args: Any, **data: Any) -> None:
        """Fields by keyword, or positionally in their order."""
        if len(args) > len(type(self).model_fields):
            raise TypeError(f"{type(self).__name__} takes {len(type(self).model_fields)} fields")
        super().__init__(**dict(zip(type(self).model_fields, args, strict=False)), **data)


def _one_line(cls: type[BaseModel], err: Mapping[str, Any], prefix: str) -> str:
    """One pydantic error of `cls` in one line. A rule's own sentence (a jaxstack error, or any
    model-level one) is kept, after the section it concerns; an unknown key gets the nearest
    valid one; anything else is `key: <pydantic's message>, got <value>`."""
    loc = [str(part) for part in err["loc"]]
    key = ".".join([prefix, *loc] if prefix else loc)
    cause = (err.get("ctx") or {}).get("error")
    if type(cause).__module__.startswith("jaxstack.") or (cause and not loc):
        return f"{prefix}: {cause}" if prefix else str(cause)
    if err["type"] != "extra_forbidden":
        return f"{key or cls.__name__}: {cause or err['msg']}, got {err['input']!r}"
    for part in loc[:-1]:  # down to the section that holds the unknown key
        hint = cls.model_fields[part].annotation
        cls = next(t for t in (hint, *typing.get_args(hint)) if isinstance(t, type))
    valid = sorted(cls.model_fields)
    for field, info in cls.model_fields.items():  # an alias given beside its field
        if loc[-1] in getattr(info.validation_alias, "choices", ()):
            return f"{key!r} and {key.removesuffix(loc[-1]) + field!r} are one setting; keep one"
    near = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
    hint = f" Did you mean {key.removesuffix(loc[-1]) + near[0]!r}?" if near else ""
    return f"unknown key {key!r}.{hint} Valid keys here: {', '.join(valid)}"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader reading floats as YAML 1.2 does: `3e-4` and `1E5` are numbers."""


_EXPONENT = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")  # YAML 1.1 misses these
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT, list("-+0123456789"))


def load_yaml(text: Any) -> Any:
    """YAML text (or a binary file) as plain data, safely (no Python objects), YAML 1.2 floats."""
    return yaml.load(text, Loader=_Loader)


def read_yaml_file(path: str | os.PathLike[str], error: type[Exception] = ConfigError) -> Any:
    """A YAML file's data, or `error` naming the file and what is wrong: unreadable, not YAML,
    not UTF-8 text (PyYAML's reader says where)."""
    try:
        with open(path, "rb") as f:
            return load_yaml(f)
    except OSError as e:
        raise error(f"{str(path)!r}: cannot read the file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise error(f"{str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from None
