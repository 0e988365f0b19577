"""OptimizerConfig and ScheduleConfig: the whole optimiser recipe as plain, checked data.

Both are frozen pydantic models: a field's type, default, range and docstring are declared once
and give the checks, the JSON Schema (`OptimizerConfig.model_json_schema()`) and the messages.
A config round-trips through `to_dict`/`from_dict` (and YAML), so it can live in a training
config file and in checkpoint metadata. Every value is checked when the config is made, not when
the first step runs: an unknown name lists the valid ones, a negative or NaN hyperparameter is an
error, and a field that the chosen optimiser would silently ignore is an error too, so a typo'd
recipe never trains quietly with settings nobody asked for.

Made directly (keywords, or positionally in field order) or by `model_validate`, a config raises
pydantic's `ValidationError` (a `ValueError`; each problem located by its field). `from_dict`,
`from_yaml` and `replace`, the ways in for config files, raise a one-line `ConfigError`: the
dotted field, pydantic's message (the range, the valid names or the type) and the bad value. A
cross-field rule's `ConfigError` is a sentence that names its fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import pydantic
import yaml
from pydantic import AliasChoices, Field, field_validator, model_validator

from jaxstack.optlib._src.config_model import PositionalConfigModel, load_yaml, read_yaml_file
from jaxstack.optlib._src.errors import ConfigError
from jaxstack.optlib._src.paths import compile_regexes

OptimizerName = Literal["adamw", "adam", "lion", "adafactor", "sgd", "muon", "schedule_free_adamw"]
ScheduleName = Literal["constant", "warmup_cosine", "warmup_linear", "wsd", "inverse_sqrt"]
OPTIMIZERS = get_args(OptimizerName)
"""The optimiser names `OptimizerConfig(name=...)` accepts; each builds plain Optax."""
SCHEDULES = get_args(ScheduleName)
"""The learning-rate schedule names `ScheduleConfig(name=...)` accepts."""

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

# The optional fields each optimiser reads; another one set away from its default is an error.
_USES = {
    "adamw": {"b1", "b2", "eps", "nesterov"},
    "adam": {"b1", "b2", "eps", "nesterov"},
    "lion": {"b1", "b2"},
    "adafactor": {"momentum", "eps"},
    "sgd": {"momentum", "nesterov"},
    "muon": {"b1", "b2", "eps", "momentum", "nesterov", "muon_exclude", "muon_dimension_numbers"},
    "schedule_free_adamw": {"b1", "b2", "eps"},
}
_OPTIONAL = set().union(*_USES.values())


def _tuple(value: Any) -> Any:
    """One item (a regex, an axis) or a list of them, as a tuple."""
    if isinstance(value, str | int):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _axes_pair(value: Any) -> Any:
    """`[reduction, output]` or `{reduction_axis, output_axis}` (each an axis or a list of
    axes), or null."""
    if isinstance(value, Mapping):
        value = [value.get("reduction_axis"), value.get("output_axis")]
    if value is not None and (not isinstance(value, list | tuple) or len(value) != 2):
        raise ValueError("must be [reduction_axes, output_axes] or null")
    return _tuple(value)


Regexes = Annotated[tuple[str, ...], pydantic.BeforeValidator(_tuple)]
Axes = Annotated[tuple[int, ...], Field(min_length=1), pydantic.BeforeValidator(_tuple)]
AxesPair = Annotated[tuple[Axes, Axes] | None, pydantic.BeforeValidator(_axes_pair)]


class ScheduleConfig(PositionalConfigModel):
    """A learning-rate schedule, as a multiple of `OptimizerConfig.learning_rate`.

    Steps are optimiser updates: with `accumulate_steps=k` one schedule step is k micro-batches.
    """

    name: ScheduleName = "constant"
    """The schedule's shape."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup from `init_lr_ratio * lr` to `lr` (all schedules; for "constant" it is the
    only shape, for schedule-free AdamW the usual choice)."""
    total_steps: int | None = Field(None, ge=1)
    """The step where cosine, linear or WSD decay ends (needed by those three, and
    by `warmup_ratio`)."""
    final_lr_ratio: float = Field(0.0, ge=0)
    """The learning rate at `total_steps`, as a fraction of `lr`."""
    decay_steps: int | None = Field(None, ge=1)
    """WSD only: length of the final decay phase (it starts at `total_steps - decay_steps`; the
    stable phase fills the rest)."""
    init_lr_ratio: float = Field(0.0, ge=0)
    """The learning rate at step 0, as a fraction of `lr`."""
    decay_shape: Literal["linear", "cosine", "sqrt"] = "linear"
    """WSD only: the decay's shape ("sqrt" is 1 - sqrt of the progress)."""
    warmup_ratio: float | None = Field(None, ge=0, lt=1)
    """The warmup as a share of `total_steps` (TRL's `warmup_ratio`); set, it replaces
    `warmup_steps` (`warmup` is the steps either gives)."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @property
    def warmup(self) -> int:
        """The warmup's steps: `warmup_ratio` of `total_steps` when set, else `warmup_steps`."""
        ratio, total = self.warmup_ratio, self.total_steps or 0
        return self.warmup_steps if ratio is None else int(ratio * total)

    @model_validator(mode="after")
    def _phases(self) -> ScheduleConfig:
        name, total, decay, warmup = self.name, self.total_steps, self.decay_steps, self.warmup
        if name in ("warmup_cosine", "warmup_linear", "wsd") and total is None:
            raise ConfigError(f"schedule {name!r} needs total_steps (where the decay ends)")
        if self.warmup_ratio is not None and total is None:
            raise ConfigError("schedule.warmup_ratio needs total_steps (the run's length)")
        if name == "wsd" and decay is None:
            raise ConfigError("schedule 'wsd' needs decay_steps (length of the final decay)")
        for field, default in (("decay_steps", None), ("decay_shape", "linear")):
            if name != "wsd" and getattr(self, field) != default:
                raise ConfigError(f"schedule.{field} is only used by 'wsd', not {name!r}")
        if total is not None and warmup + (decay or 0) > total:
            steps = "warmup + decay_steps" if decay else "warmup"
            raise ConfigError(
                f"schedule.{steps} ({warmup}{f' + {decay}' if decay else ''}) exceeds "
                f"total_steps ({total}); shorten the warmup or lengthen the run"
            )
        return self


class OptimizerConfig(PositionalConfigModel):
    """An optimiser recipe; `build_optimizer(config, params)` turns it into plain Optax.

    Regexes use `re.search` on the `/`-joined parameter path (`layers/0/attn/q_proj/kernel`).
    """

    name: OptimizerName = "adamw"
    """The optimiser (`OPTIMIZERS`)."""
    learning_rate: float = Field(1e-3, ge=0, validation_alias=AliasChoices("learning_rate", "lr"))
    """The peak learning rate (`lr` for short); `schedule` scales it over time."""
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
    lr_multipliers: dict[str, Annotated[float, Field(ge=0)]] = Field({})
    """Regex -> factor on the learning rate of matching parameters (the first matching regex
    wins; the others keep factor 1)."""
    frozen: Regexes = ()
    """Regexes of parameters that never change and keep no optimiser state."""
    muon_exclude: Regexes | None = None
    """muon only: regexes of matrices sent to the Adam fallback anyway; null means
    `DEFAULT_MUON_EXCLUDE` (embeddings and the output head)."""
    muon_dimension_numbers: dict[str, AxesPair] = Field({})
    """muon only: regex -> `[reduction_axes, output_axes]` for parameters that are matrices in
    disguise (a `[embed, heads, head_dim]` kernel, a scanned `[layers, in, out]` stack: the
    other axes are batch axes), or null to send them to the Adam fallback. Unmatched
    parameters use the default rule (2-D -> muon)."""

    @field_validator(
        "weight_decay_mask", "frozen", "muon_exclude", "lr_multipliers", "muon_dimension_numbers"
    )
    @classmethod
    def _regexes_compile(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        compile_regexes(value or (), str(info.field_name))
        return value

    @model_validator(mode="after")
    def _applies(self) -> OptimizerConfig:
        """Fields the chosen optimiser would ignore, and its own bounds."""
        name, fields = self.name, type(self).model_fields
        unused = sorted(f for f in _OPTIONAL - _USES[name] if getattr(self, f) != fields[f].default)
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
        """From YAML text, or from a `.yaml`/`.yml` file path."""
        if isinstance(source, os.PathLike) or (
            "\n" not in source and source.endswith((".yaml", ".yml"))
        ):
            return cls.from_dict(read_yaml_file(source) or {})
        return cls.from_dict(load_yaml(source) or {})

    def to_yaml(self) -> str:
        """YAML text that `from_yaml` reads back."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
