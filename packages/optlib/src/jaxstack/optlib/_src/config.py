"""OptimizerConfig and ScheduleConfig: the whole optimiser recipe as plain, checked data.

Both are frozen pydantic models: a field's type, default, range and docstring are declared once
and give the checks, the JSON Schema (`OptimizerConfig.model_json_schema()`) and the messages.
A config round-trips through `to_dict`/`from_dict` (and YAML), so it can live in a training
config file and in checkpoint metadata. Every value is checked when the config is made, not when
the first step runs: an unknown name lists the valid ones, a negative or NaN hyperparameter is an
error, and a field that the chosen optimiser would silently ignore is an error too, so a typo'd
recipe never trains quietly with settings nobody asked for. The constructor, `from_dict`,
`from_yaml` and `replace` raise `ConfigError` (one line naming the field); pydantic's own
`model_validate` raises pydantic's `ValidationError`, for callers that word errors themselves.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jaxstack.optlib._src.errors import ConfigError
from jaxstack.optlib._src.paths import compile_regexes

OptimizerName = Literal["adamw", "adam", "lion", "adafactor", "sgd", "muon", "schedule_free_adamw"]
ScheduleName = Literal["constant", "warmup_cosine", "warmup_linear", "wsd", "inverse_sqrt"]
DecayShape = Literal["linear", "cosine", "sqrt"]
OPTIMIZERS = get_args(OptimizerName)
"""The optimiser names `OptimizerConfig(name=...)` accepts; each builds plain Optax."""
SCHEDULES = get_args(ScheduleName)
"""The learning-rate schedule names `ScheduleConfig(name=...)` accepts."""
WSD_DECAY_SHAPES = get_args(DecayShape)

DEFAULT_NO_DECAY = (
    r"(?i)(^|/)[^/]*(norm|ln_)[^/]*(/|$)",
    r"(?i)(^|/)(ln|ln_f|ln\d+)(/|$)",
    r"(?i)(^|/)[^/]*bias[^/]*$",
    r"(?i)(^|/)[^/]*(embed|wte|wpe)[^/]*(/|$)",
)
"""Path regexes of the parameters that get no weight decay when `weight_decay_mask` is None:
normalisation scales, biases and embedding tables (any path component naming them, any case)."""
DEFAULT_MUON_EXCLUDE = (
    r"(?i)(^|/)[^/]*(embed|wte|wpe)[^/]*(/|$)",
    r"(?i)(^|/)(lm_head|output_head|head)(/|$)",
)
"""Path regexes of the matrices muon leaves to its Adam fallback by default: embedding tables
and the output head, as the muon authors recommend. Non-matrix parameters always fall back."""

# Optional hyperparameters each optimiser reads; setting another one is a ConfigError.
_USES = {
    "adamw": {"b1", "b2", "eps", "nesterov"},
    "adam": {"b1", "b2", "eps", "nesterov"},
    "lion": {"b1", "b2"},
    "adafactor": {"momentum", "eps"},
    "sgd": {"momentum", "nesterov"},
    "muon": {"b1", "b2", "eps", "momentum", "nesterov"},
    "schedule_free_adamw": {"b1", "b2", "eps"},
}
_OPTIONAL = ("b1", "b2", "eps", "momentum", "nesterov")
# How a value outside a field's type or range is said: "<field> must be <words>, got <value>".
_MUST = {
    "float_type": "a number",
    "int_type": "an integer",
    "bool_type": "true or false",
    "string_type": "a string",
    "finite_number": "a finite number",
    "tuple_type": "a list",
    "too_short": "a non-empty list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "greater_than": "> {gt}",
    "greater_than_equal": ">= {ge}",
    "less_than": "< {lt}",
    "less_than_equal": "<= {le}",
}
# Fields with a fixed set of names: how the name is called, and the valid ones.
_CHOICES = {
    "name": ("optimizer name", "optimizers", OPTIMIZERS),
    "schedule.name": ("schedule name", "schedules", SCHEDULES),
    "schedule.decay_shape": ("schedule.decay_shape", "shapes", WSD_DECAY_SHAPES),
}

Regexes = tuple[str, ...]
Axes = Annotated[tuple[int, ...], Field(min_length=1)]


class _Checked(BaseModel):
    """Strict (no bool for a number, no "yes" for true), frozen, no unknown keys; built from
    keywords (or positionally, in field order) it raises ConfigError, not ValidationError."""

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )
    _what: ClassVar[str] = "config"
    _prefix: ClassVar[str] = ""

    def __init__(self, *args: Any, **data: Any) -> None:
        names = list(type(self).model_fields)
        if len(args) > len(names) or set(names[: len(args)]) & set(data):
            raise TypeError(f"{type(self).__name__}: too many or repeated arguments")
        try:
            super().__init__(**dict(zip(names, args, strict=False)), **data)
        except ValidationError as error:
            raise ConfigError(explain(type(self), error)) from None

    # Marks this __init__ as pydantic's own (as pydantic's RootModel does), so validation
    # (`model_validate`, a nested schedule, a model embedding this one) does not call it and
    # keeps pydantic's structured errors: only a direct call is worded as a ConfigError.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """From a plain mapping (as parsed from JSON or YAML); unknown keys are errors."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{cls._what} must be a mapping, got {type(data).__name__}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-ready dict (lists, not tuples) that `from_dict` reads back."""
        return self.model_dump(mode="json")

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed (checked again)."""
        return type(self)(**{**dict(self), **changes})


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 (PyYAML) reads `1e-3`, an exponent without a dot, as a string: take the number
    it means; anything else is left for the type check to name."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _regex_list(value: Any) -> Any:
    """One regex or a list of them, as a tuple."""
    return (value,) if isinstance(value, str) else _tuple(value)


class ScheduleConfig(_Checked):
    """A learning-rate schedule, as a multiple of `OptimizerConfig.learning_rate`.

    Steps are optimiser updates: with `accumulate_steps=k` one schedule step is k micro-batches.
    """

    _what: ClassVar[str] = "schedule"
    _prefix: ClassVar[str] = "schedule."

    name: ScheduleName = "constant"
    """The schedule's shape."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup from `init_lr_ratio * lr` to `lr` (all schedules; for "constant" it is the
    only shape, for schedule-free AdamW the usual choice)."""
    total_steps: int | None = Field(None, ge=1)
    """The step where cosine, linear or WSD decay ends (needed by those three)."""
    final_lr_ratio: float = Field(0.0, ge=0)
    """The learning rate at `total_steps`, as a fraction of `lr`."""
    decay_steps: int | None = Field(None, ge=1)
    """WSD only: length of the final decay phase (it starts at `total_steps - decay_steps`; the
    stable phase fills the rest)."""
    init_lr_ratio: float = Field(0.0, ge=0)
    """The learning rate at step 0, as a fraction of `lr`."""
    decay_shape: DecayShape = "linear"
    """WSD only: the decay's shape ("sqrt" is 1 - sqrt of the progress)."""

    _numbers = field_validator("final_lr_ratio", "init_lr_ratio", mode="before")(_yaml_number)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str) -> ScheduleConfig:
        """From a mapping, or from just a schedule name."""
        return cls(name=data) if isinstance(data, str) else super().from_dict(data)

    @model_validator(mode="after")
    def _phases(self) -> ScheduleConfig:
        name, warmup, total = self.name, self.warmup_steps, self.total_steps
        decay = self.decay_steps
        if name in ("warmup_cosine", "warmup_linear", "wsd") and total is None:
            raise ConfigError(f"schedule {name!r} needs total_steps (where the decay ends)")
        if total is not None and warmup > total:
            raise ConfigError(
                f"schedule.warmup_steps ({warmup}) exceeds total_steps ({total}); shorten the "
                "warmup or lengthen the run"
            )
        if name == "wsd":
            if decay is None:
                raise ConfigError("schedule 'wsd' needs decay_steps (length of the final decay)")
            if warmup + decay > total:
                raise ConfigError(
                    f"schedule 'wsd': warmup_steps + decay_steps ({warmup} + {decay}) exceeds "
                    f"total_steps ({total})"
                )
        elif decay is not None:
            raise ConfigError(
                f"schedule.decay_steps is only used by 'wsd', not {name!r}; remove it "
                "(cosine and linear decay end at total_steps)"
            )
        if name != "wsd" and self.decay_shape != "linear":
            raise ConfigError(f"schedule.decay_shape is only used by 'wsd', not {name!r}")
        return self


class OptimizerConfig(_Checked):
    """An optimiser recipe; `build_optimizer(config, params)` turns it into plain Optax.

    Regexes use `re.search` on the `/`-joined parameter path (`layers/0/attn/q_proj/kernel`).
    """

    _what: ClassVar[str] = "optimizer config"

    name: OptimizerName = "adamw"
    """The optimiser (`OPTIMIZERS`)."""
    learning_rate: float = Field(1e-3, ge=0)
    """The peak learning rate; `schedule` scales it over time."""
    schedule: ScheduleConfig = ScheduleConfig()
    """The learning-rate schedule (a mapping of its fields, or just its name)."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled (AdamW-style, multiplied by the learning rate) for adamw, lion, adafactor, muon
    and schedule_free_adamw; classic L2 added to the gradient for adam and sgd."""
    weight_decay_mask: Regexes | None = None
    """Regexes of the parameter paths that get NO weight decay; null means `DEFAULT_NO_DECAY`
    (norms, biases, embeddings); an empty list decays every parameter."""
    clip_norm: float | None = Field(None, gt=0)
    """Clip gradients to this global L2 norm before the optimiser; null: no clipping."""
    b1: float | None = Field(None, ge=0, le=1)
    """First-moment decay rate (below 1; lion accepts 1); null: the optimiser's own default.
    muon uses b1, b2 and eps for its Adam fallback."""
    b2: float | None = Field(None, ge=0, le=1)
    """Second-moment decay rate (below 1; lion accepts 1); null: the optimiser's default."""
    eps: float | None = Field(None, ge=0)
    """Epsilon of the denominator; null: the optimiser's default."""
    momentum: float | None = Field(None, ge=0, lt=1)
    """sgd momentum, adafactor momentum, muon's momentum (its `beta`)."""
    nesterov: bool | None = None
    """Nesterov momentum of sgd, adam(w) and muon; null: the optimiser's default."""
    accumulate_steps: int = Field(1, ge=1)
    """Average gradients over k calls before one update (`optax.MultiSteps`; 1 adds no wrapper
    and no buffer). optlib's one way to accumulate: call the update once per micro-batch, the
    parameters change on every k-th call; do not also accumulate in the training loop."""
    ema_decay: float | None = Field(None, ge=0, lt=1)
    """Keep an exponential moving average of the parameters (read it with `ema_params`); null
    keeps none."""
    skip_nonfinite: bool = False
    """Skip updates whose gradients hold NaN/Inf and count them (`optax.apply_if_finite`; read
    the count with `nonfinite_count`)."""
    max_consecutive_nonfinite: int = Field(10, ge=1)
    """After this many skipped updates in a row the update is applied anyway, so a diverged run
    fails visibly instead of idling."""
    lr_multipliers: dict[str, Annotated[float, Field(ge=0)]] = {}
    """Regex -> factor on the learning rate of matching parameters (the first matching regex
    wins; the others keep factor 1)."""
    frozen: Regexes = ()
    """Regexes of parameters that never change and keep no optimiser state."""
    muon_exclude: Regexes | None = None
    """muon only: regexes of matrices sent to the Adam fallback anyway; null means
    `DEFAULT_MUON_EXCLUDE` (embeddings and the output head)."""
    muon_dimension_numbers: dict[str, tuple[Axes, Axes] | None] = {}
    """muon only: regex -> `[reduction_axes, output_axes]` for parameters that are matrices in
    disguise (a `[embed, heads, head_dim]` kernel, a scanned `[layers, in, out]` stack: the
    other axes are batch axes), or null to send them to the Adam fallback. Unmatched
    parameters use the default rule (2-D -> muon)."""

    _numbers = field_validator(
        "learning_rate",
        "weight_decay",
        "clip_norm",
        "b1",
        "b2",
        "eps",
        "momentum",
        "ema_decay",
        mode="before",
    )(_yaml_number)
    _regex_lists = field_validator("weight_decay_mask", "frozen", "muon_exclude", mode="before")(
        _regex_list
    )

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("lr_multipliers", mode="before")
    @classmethod
    def _multipliers(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        compile_regexes(value, "lr_multipliers")
        return {regex: _yaml_number(factor) for regex, factor in value.items()}

    @field_validator("muon_dimension_numbers", mode="before")
    @classmethod
    def _dimension_numbers(cls, value: Any) -> Any:
        """`[reduction, output]` (an axis or a list of axes each), `{reduction_axis,
        output_axis}`, or null, as a pair of tuples."""
        if not isinstance(value, Mapping):
            return value
        compile_regexes(value, "muon_dimension_numbers")
        out = {}
        for regex, dims in value.items():
            if isinstance(dims, Mapping):
                dims = (dims.get("reduction_axis"), dims.get("output_axis"))
            if dims is not None and (not isinstance(dims, list | tuple) or len(dims) != 2):
                raise ConfigError(
                    f"muon_dimension_numbers[{regex!r}] must be [reduction_axes, output_axes] "
                    f"or null, got {dims!r}"
                )
            out[regex] = dims and tuple(
                (a,) if isinstance(a, int) and not isinstance(a, bool) else _tuple(a) for a in dims
            )
        return out

    @field_validator("weight_decay_mask", "frozen", "muon_exclude")
    @classmethod
    def _compiles(cls, value: Regexes | None, info: Any) -> Regexes | None:
        compile_regexes(value or (), info.field_name)
        return value

    @model_validator(mode="after")
    def _applies(self) -> OptimizerConfig:
        """Fields the chosen optimiser would ignore, and its own bounds."""
        name = self.name
        unused = [f for f in _OPTIONAL if getattr(self, f) is not None and f not in _USES[name]]
        if unused:
            raise ConfigError(
                f"{unused} have no effect with optimizer {name!r} (it reads "
                f"{sorted(_USES[name])}); remove them"
            )
        for field in ("b1", "b2"):
            if name != "lion" and getattr(self, field) == 1:
                raise ConfigError(f"{field} must be < 1 with {name!r} (only lion takes 1), got 1")
        if name == "sgd" and self.nesterov and not self.momentum:
            raise ConfigError("sgd with nesterov=true needs momentum > 0; set momentum")
        if self.muon_exclude is not None and name != "muon":
            raise ConfigError(f"muon_exclude only applies to muon, not {name!r}")
        if self.muon_dimension_numbers and name != "muon":
            raise ConfigError(f"muon_dimension_numbers only applies to muon, not {name!r}")
        return self

    @property
    def no_decay_regexes(self) -> tuple[str, ...]:
        """The effective regexes of parameters without weight decay."""
        return DEFAULT_NO_DECAY if self.weight_decay_mask is None else self.weight_decay_mask

    @property
    def muon_exclude_regexes(self) -> tuple[str, ...]:
        """The effective regexes of matrices muon leaves to its Adam fallback."""
        return DEFAULT_MUON_EXCLUDE if self.muon_exclude is None else self.muon_exclude

    @classmethod
    def from_yaml(cls, source: str | os.PathLike[str]) -> OptimizerConfig:
        """From YAML text, or from a `.yaml`/`.yml` file path (needs PyYAML: `[yaml]` extra)."""
        yaml = _import_yaml()
        if isinstance(source, os.PathLike) or (
            "\n" not in source and source.endswith((".yaml", ".yml"))
        ):
            path = pathlib.Path(source)
            if not path.is_file():
                raise ConfigError(f"optimizer config file {str(path)!r} does not exist")
            source = path.read_text()
        return cls.from_dict(yaml.safe_load(source) or {})

    def to_yaml(self) -> str:
        """YAML text that `from_yaml` reads back."""
        return _import_yaml().safe_dump(self.to_dict(), sort_keys=False)


def explain(cls: type[_Checked], error: ValidationError) -> str:
    """The first problem of a ValidationError as one line naming the field, the value and the
    range, the valid names or the valid fields."""
    first = error.errors()[0]
    loc, kind, value, ctx = first["loc"], first["type"], first.get("input"), first.get("ctx", {})
    field = _field_path(cls, loc)
    if kind == "value_error":
        cause = ctx.get("error")
        return str(cause) if isinstance(cause, ConfigError) else f"{field} {cause}, got {value!r}"
    if kind == "extra_forbidden":
        parent = ScheduleConfig if loc[:-1] == ("schedule",) else cls
        unknown = sorted(
            str(e["loc"][-1])
            for e in error.errors()
            if e["type"] == kind and e["loc"][:-1] == loc[:-1]
        )
        valid = list(parent.model_fields)
        return f"{parent._what}: unknown field(s) {unknown}; valid fields: {valid}"
    if kind == "literal_error" and field in _CHOICES:
        what, plural, names = _CHOICES[field]
        return f"{what} {value!r} is unknown; valid {plural}: {list(names)}"
    if kind in _MUST:
        return f"{field} must be {_MUST[kind].format(**ctx)}, got {value!r}"
    return f"{field}: {first['msg']}, got {value!r}"


def _field_path(cls: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """`("schedule", "warmup_steps")` -> "schedule.warmup_steps"; a mapping's key or a list's
    index in brackets: "lr_multipliers['norm']", "frozen[0]"."""
    path, model = cls._prefix, cls
    for part in loc:
        if model is not None and part in model.model_fields:
            path += f".{part}" if path and not path.endswith(".") else str(part)
            inner = model.model_fields[part].annotation
            model = inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None
        else:
            path, model = f"{path}[{part!r}]", None
    return path


def _import_yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError("YAML configs need PyYAML: pip install 'jaxstack-optlib[yaml]'") from None
    return yaml
