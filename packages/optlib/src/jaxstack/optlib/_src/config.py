"""OptimizerConfig and ScheduleConfig: the whole optimiser recipe as plain, checked data.

A config is a frozen dataclass that round-trips through `to_dict`/`from_dict` (and YAML), so it
can live in a training config file and in checkpoint metadata. Every value is checked when the
config is made, not when the first step runs: an unknown name lists the valid ones, a negative or
NaN hyperparameter is an error, and a field that the chosen optimiser would silently ignore is an
error too, so a typo'd recipe never trains quietly with settings nobody asked for.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from jaxstack.optlib._src.errors import ConfigError
from jaxstack.optlib._src.paths import compile_regexes

OPTIMIZERS = ("adamw", "adam", "lion", "adafactor", "sgd", "muon", "schedule_free_adamw")
"""The optimiser names `OptimizerConfig(name=...)` accepts; each builds plain Optax."""
SCHEDULES = ("constant", "warmup_cosine", "warmup_linear", "wsd", "inverse_sqrt")
"""The learning-rate schedule names `ScheduleConfig(name=...)` accepts."""
WSD_DECAY_SHAPES = ("linear", "cosine", "sqrt")

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


def _number(
    value: Any,
    field: str,
    *,
    low: float = 0.0,
    high: float | None = None,
    high_open: bool = True,
    low_open: bool = False,
) -> float:
    """A float within [low, high) (or the given openness); strings like "1e-3" are accepted
    because YAML 1.1 reads an exponent without a dot as a string."""
    if isinstance(value, bool):
        raise ConfigError(f"{field} must be a number, got the bool {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{field} must be a number, got {value!r}") from None
    if not isinstance(value, int | float):
        raise ConfigError(f"{field} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ConfigError(f"{field} must be a finite number, got {value}")
    if value < low or (low_open and value == low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ConfigError(f"{field} must be {bound}, got {value}")
    if high is not None and (value > high or (high_open and value == high)):
        bound = f"< {high}" if high_open else f"<= {high}"
        raise ConfigError(f"{field} must be {bound}, got {value}")
    return value


def _integer(value: Any, field: str, *, low: int = 0) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ConfigError(f"{field} must be an integer, got {value!r}")
    if value < low:
        raise ConfigError(f"{field} must be >= {low}, got {value}")
    return int(value)


def _boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be true or false, got {value!r}")
    return value


def _regex_tuple(value: Any, field: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{field} must be a list of regex strings, got {value!r}")
    compile_regexes(value, field)
    return tuple(value)


def _set(instance: Any, name: str, value: Any) -> None:
    object.__setattr__(instance, name, value)


def _from_mapping(cls: type, data: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what} must be a mapping, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{what}: unknown field(s) {unknown}; valid fields: {names}")
    return dict(data)


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """A learning-rate schedule, as a multiple of `OptimizerConfig.learning_rate`.

    Attributes:
      name: "constant" | "warmup_cosine" | "warmup_linear" | "wsd" | "inverse_sqrt".
      warmup_steps: linear warmup from `init_lr_ratio * lr` to `lr` (all schedules; for
        "constant" it is the only shape, for schedule-free AdamW the usual choice).
      total_steps: the step where cosine/linear/WSD decay ends (needed by those three).
      final_lr_ratio: the learning rate at `total_steps`, as a fraction of `lr`.
      decay_steps: WSD only: length of the final decay phase (it starts at
        `total_steps - decay_steps`; the stable phase fills the rest).
      init_lr_ratio: the learning rate at step 0, as a fraction of `lr`.
      decay_shape: WSD only: "linear" | "cosine" | "sqrt" (1 - sqrt of progress).

    Steps are optimiser updates: with `accumulate_steps=k` one schedule step is k micro-batches.
    """

    name: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    final_lr_ratio: float = 0.0
    decay_steps: int | None = None
    init_lr_ratio: float = 0.0
    decay_shape: str = "linear"

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ConfigError(
                f"schedule name {self.name!r} is unknown; valid schedules: {list(SCHEDULES)}"
            )
        _set(self, "warmup_steps", _integer(self.warmup_steps, "schedule.warmup_steps"))
        _set(self, "final_lr_ratio", _number(self.final_lr_ratio, "schedule.final_lr_ratio"))
        _set(self, "init_lr_ratio", _number(self.init_lr_ratio, "schedule.init_lr_ratio"))
        if self.decay_shape not in WSD_DECAY_SHAPES:
            raise ConfigError(
                f"schedule.decay_shape {self.decay_shape!r} is unknown; valid shapes: "
                f"{list(WSD_DECAY_SHAPES)}"
            )
        if self.total_steps is not None:
            _set(self, "total_steps", _integer(self.total_steps, "schedule.total_steps", low=1))
        if self.decay_steps is not None:
            _set(self, "decay_steps", _integer(self.decay_steps, "schedule.decay_steps", low=1))
        decays = self.name in ("warmup_cosine", "warmup_linear", "wsd")
        if decays and self.total_steps is None:
            raise ConfigError(f"schedule {self.name!r} needs total_steps (where the decay ends)")
        if self.total_steps is not None and self.warmup_steps > self.total_steps:
            raise ConfigError(
                f"schedule.warmup_steps ({self.warmup_steps}) exceeds total_steps "
                f"({self.total_steps}); shorten the warmup or lengthen the run"
            )
        if self.name == "wsd":
            if self.decay_steps is None:
                raise ConfigError("schedule 'wsd' needs decay_steps (length of the final decay)")
            if self.warmup_steps + self.decay_steps > self.total_steps:
                raise ConfigError(
                    f"schedule 'wsd': warmup_steps + decay_steps ({self.warmup_steps} + "
                    f"{self.decay_steps}) exceeds total_steps ({self.total_steps})"
                )
        elif self.decay_steps is not None:
            raise ConfigError(
                f"schedule.decay_steps is only used by 'wsd', not {self.name!r}; remove it "
                "(cosine and linear decay end at total_steps)"
            )
        if self.name != "wsd" and self.decay_shape != "linear":
            raise ConfigError(f"schedule.decay_shape is only used by 'wsd', not {self.name!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str) -> ScheduleConfig:
        """From a mapping, or from just a schedule name."""
        if isinstance(data, str):
            return cls(name=data)
        return cls(**_from_mapping(cls, data, "schedule"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """An optimiser recipe; `build_optimizer(config, params)` turns it into plain Optax.

    Attributes:
      name: one of `OPTIMIZERS`.
      learning_rate: the peak learning rate; `schedule` scales it over time.
      schedule: a `ScheduleConfig` (or a dict / a schedule name in `from_dict`).
      weight_decay: decoupled (AdamW-style, multiplied by the learning rate) for adamw, lion,
        adafactor, muon and schedule_free_adamw; classic L2 added to the gradient for adam and sgd.
      weight_decay_mask: regexes of the parameter paths that get NO weight decay; None means
        `DEFAULT_NO_DECAY` (norms, biases, embeddings); an empty list decays every parameter.
      clip_norm: clip gradients to this global L2 norm before the optimiser (None: no clipping).
      b1, b2, eps: moment decay rates and epsilon (None: the optimiser's own default). muon
        uses them for its Adam fallback.
      momentum: sgd momentum, adafactor momentum, muon's momentum (its `beta`).
      nesterov: sgd, adam(w) and muon Nesterov momentum (None: the optimiser's default).
      accumulate_steps: average gradients over k calls before one update (`optax.MultiSteps`;
        k=1 adds no wrapper and no buffer). This is the one documented way to accumulate
        gradients with optlib: call the update once per micro-batch; the parameters change on
        every k-th call. Do not also accumulate in the training loop (e.g. a scan over
        micro-batches): the two would multiply.
      ema_decay: keep an exponential moving average of the parameters (read it with
        `ema_params`); None keeps none.
      skip_nonfinite: skip updates whose gradients hold NaN/Inf and count them
        (`optax.apply_if_finite`; read the count with `nonfinite_count`).
      max_consecutive_nonfinite: after this many skipped updates in a row the update is
        applied anyway, so a diverged run fails visibly instead of idling.
      lr_multipliers: regex -> factor on the learning rate of matching parameters (the first
        matching regex wins; the others keep factor 1).
      frozen: regexes of parameters that never change and keep no optimiser state.
      muon_exclude: muon only: regexes of matrices sent to the Adam fallback anyway; None means
        `DEFAULT_MUON_EXCLUDE` (embeddings and the output head).
      muon_dimension_numbers: muon only: regex -> `[reduction_axes, output_axes]` for
        parameters that are matrices in disguise (a `[embed, heads, head_dim]` kernel, a
        scanned `[layers, in, out]` stack: the other axes are batch axes), or None to send
        them to the Adam fallback. Unmatched parameters use the default rule (2-D -> muon).

    Regexes use `re.search` on the `/`-joined parameter path (`layers/0/attn/q_proj/kernel`).
    """

    name: str = "adamw"
    learning_rate: float = 1e-3
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    weight_decay: float = 0.0
    weight_decay_mask: tuple[str, ...] | None = None
    clip_norm: float | None = None
    b1: float | None = None
    b2: float | None = None
    eps: float | None = None
    momentum: float | None = None
    nesterov: bool | None = None
    accumulate_steps: int = 1
    ema_decay: float | None = None
    skip_nonfinite: bool = False
    max_consecutive_nonfinite: int = 10
    lr_multipliers: Mapping[str, float] = dataclasses.field(default_factory=dict)
    frozen: tuple[str, ...] = ()
    muon_exclude: tuple[str, ...] | None = None
    muon_dimension_numbers: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(
                f"optimizer name {self.name!r} is unknown; valid optimizers: {list(OPTIMIZERS)}"
            )
        if isinstance(self.schedule, Mapping | str):
            _set(self, "schedule", ScheduleConfig.from_dict(self.schedule))
        if not isinstance(self.schedule, ScheduleConfig):
            raise ConfigError(f"schedule must be a ScheduleConfig or a dict, got {self.schedule!r}")
        _set(self, "learning_rate", _number(self.learning_rate, "learning_rate"))
        _set(self, "weight_decay", _number(self.weight_decay, "weight_decay"))
        if self.clip_norm is not None:
            _set(self, "clip_norm", _number(self.clip_norm, "clip_norm", low_open=True))
        for field in ("b1", "b2", "momentum"):
            if getattr(self, field) is not None:
                high_open = not (self.name == "lion" and field in ("b1", "b2"))
                _set(
                    self, field, _number(getattr(self, field), field, high=1.0, high_open=high_open)
                )
        if self.eps is not None:
            _set(self, "eps", _number(self.eps, "eps"))
        if self.nesterov is not None:
            _boolean(self.nesterov, "nesterov")
        unused = [
            f for f in _OPTIONAL if getattr(self, f) is not None and f not in _USES[self.name]
        ]
        if unused:
            raise ConfigError(
                f"{unused} have no effect with optimizer {self.name!r} (it reads "
                f"{sorted(_USES[self.name])}); remove them"
            )
        if self.name == "sgd" and self.nesterov and not self.momentum:
            raise ConfigError("sgd with nesterov=true needs momentum > 0; set momentum")
        _set(self, "accumulate_steps", _integer(self.accumulate_steps, "accumulate_steps", low=1))
        if self.ema_decay is not None:
            _set(self, "ema_decay", _number(self.ema_decay, "ema_decay", high=1.0))
        _boolean(self.skip_nonfinite, "skip_nonfinite")
        _set(
            self,
            "max_consecutive_nonfinite",
            _integer(self.max_consecutive_nonfinite, "max_consecutive_nonfinite", low=1),
        )
        if self.weight_decay_mask is not None:
            _set(
                self, "weight_decay_mask", _regex_tuple(self.weight_decay_mask, "weight_decay_mask")
            )
        _set(self, "frozen", _regex_tuple(self.frozen, "frozen"))
        if self.muon_exclude is not None:
            if self.name != "muon":
                raise ConfigError(f"muon_exclude only applies to muon, not {self.name!r}")
            _set(self, "muon_exclude", _regex_tuple(self.muon_exclude, "muon_exclude"))
        _set(self, "muon_dimension_numbers", _dimension_numbers(self))
        if not isinstance(self.lr_multipliers, Mapping):
            raise ConfigError(
                f"lr_multipliers must map regex -> factor, got {self.lr_multipliers!r}"
            )
        compile_regexes(self.lr_multipliers, "lr_multipliers")
        _set(
            self,
            "lr_multipliers",
            {k: _number(v, f"lr_multipliers[{k!r}]") for k, v in self.lr_multipliers.items()},
        )

    @property
    def no_decay_regexes(self) -> tuple[str, ...]:
        """The effective regexes of parameters without weight decay."""
        return DEFAULT_NO_DECAY if self.weight_decay_mask is None else self.weight_decay_mask

    @property
    def muon_exclude_regexes(self) -> tuple[str, ...]:
        return DEFAULT_MUON_EXCLUDE if self.muon_exclude is None else self.muon_exclude

    def replace(self, **changes: Any) -> OptimizerConfig:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizerConfig:
        """From a plain mapping (as parsed from JSON or YAML); unknown keys are errors."""
        return cls(**_from_mapping(cls, data, "optimizer config"))

    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-ready dict (lists, not tuples) that `from_dict` reads back."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["schedule"] = self.schedule.to_dict()
        out["lr_multipliers"] = dict(self.lr_multipliers)
        out["muon_dimension_numbers"] = {
            k: None if v is None else [list(v[0]), list(v[1])]
            for k, v in self.muon_dimension_numbers.items()
        }
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

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
        data = yaml.safe_load(source)
        return cls.from_dict(data or {})

    def to_yaml(self) -> str:
        return _import_yaml().safe_dump(self.to_dict(), sort_keys=False)


def _axes(value: Any, field: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return tuple(value)
    raise ConfigError(f"{field}: axes must be an int or a non-empty list of ints, got {value!r}")


def _dimension_numbers(config: OptimizerConfig) -> dict[str, Any]:
    dims = config.muon_dimension_numbers
    if not isinstance(dims, Mapping):
        raise ConfigError(
            f"muon_dimension_numbers must map regex -> [reduction, output], got {dims!r}"
        )
    if dims and config.name != "muon":
        raise ConfigError(f"muon_dimension_numbers only applies to muon, not {config.name!r}")
    compile_regexes(dims, "muon_dimension_numbers")
    out = {}
    for regex, value in dims.items():
        field = f"muon_dimension_numbers[{regex!r}]"
        if value is None:
            out[regex] = None
            continue
        if isinstance(value, Mapping):
            value = (value.get("reduction_axis"), value.get("output_axis"))
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(
                f"{field} must be [reduction_axes, output_axes] or null, got {value!r}"
            )
        out[regex] = (_axes(value[0], field), _axes(value[1], field))
    return out


def _import_yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError("YAML configs need PyYAML: pip install 'jaxstack-optlib[yaml]'") from None
    return yaml
