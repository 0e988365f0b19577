"""Run configuration: YAML presets, dotted command-line overrides, validation, saving.

A run is described by one nested mapping with eight sections. The trainer owns six of them
(`data`, `mesh`, `train`, `eval`, `checkpoint`, `log`) and declares them here as dataclasses; the
other two are handed to sibling packages and validated against *their* dataclasses, so there is
one source of truth for each field:

- `model`: `preset` (an nnlib preset name) plus any `jaxstack.nnlib.ModelConfig` field;
- `optim`: any `jaxstack.optlib.OptimizerConfig` field (`lr` is accepted for `learning_rate`),
  with `schedule` a nested mapping of `ScheduleConfig` fields.

Presets are YAML files shipped in the package (`list_configs()`); `load_config("tiny",
["model.num_layers=2", "optim.lr=3e-4"])` reads one, applies the overrides in order and validates
the result. An unknown key is an error that suggests the nearest valid key, and every value is
checked when the config is loaded (types, ranges, and the model and optimiser built as nnlib and
optlib would build them), so a bad value is one line naming the key and the fix before anything
runs. Files and override values are read by one YAML loader with one coercion scheme. The
resolved config is written next to every run (`config.yaml`) so a run can be repeated with
`--config` on it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import os
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from jaxstack.trainer._src.errors import ConfigError

ALIASES = {"optim.lr": "optim.learning_rate"}


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are batched.

    `batch_size` is the *global* number of sequences per optimiser step (over all devices and
    all accumulation micro-steps), so changing the mesh never changes the maths.
    """

    path: str | None = None  # text file or folder of .txt files; None = datalib's default corpus
    validation_path: str | None = None  # evaluation text; None = the training files
    tokenizer: str = "byte"  # "byte" or a path to a BPE tokenizer JSON file
    # The model's vocab_size follows the tokenizer unless model.vocab_size is set explicitly;
    # real-size presets turn this off to keep their published vocabulary.
    vocab_from_tokenizer: bool = True
    seq_len: int = 256
    batch_size: int = 8
    packing: str = "first_fit"
    num_workers: int = 0
    seed: int = 0
    # Data shards the global batch is cut into (each read by datalib with shard_index /
    # shard_count); None = one per process. Must be a multiple of the process count.
    num_shards: int | None = None
    prefetch: int = 2  # device batches kept ready by a background thread


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh axes; one axis may be -1 to take the remaining devices.

    `rules` overrides entries of the default logical-axis rules (see `mesh.DEFAULT_RULES`).
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1
    rules: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """The `train:` section of a run config: steps, gradient accumulation, seed, loss weights,
    buffer donation, and the host-side speed settings (attention implementation, XLA flags,
    compile cache, host allocator, CPU matmul backend)."""

    steps: int = 300
    grad_accum: int = 1
    seed: int = 0
    z_loss_weight: float = 0.0
    moe_load_balance_weight: float = 0.01
    moe_router_z_weight: float = 0.001
    donate: bool = True
    attention: str = "xla"  # or "kernlib" (extra `kernels`): kernlib's attention in the model
    # XLA flags the CLI adds before JAX starts (jaxlib >= 0.12), e.g.
    # "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise" (3% slower here once host memory is
    # retained, so not the default; see benchmarks/train/README.md).
    xla_flags: str | None = None
    # JAX's persistent compilation cache: a restarted or resumed run skips recompiling.
    compile_cache: str | None = "~/.cache/jaxstack/jax"
    # "retain": glibc keeps freed host memory for the next step instead of unmapping it (XLA:CPU's
    # per-step buffers otherwise page-fault back in every step); "system": leave malloc alone;
    # "auto": a run of 40+ steps times its first 12 steps under each and keeps the faster
    # (xprof-lite's HostAllocatorTrial); a shorter run takes the CPU flags' guess.
    host_allocator: str = "auto"
    # XLA:CPU's matmul kernels for the train step: "default" (XLA's own, YNNPACK in jaxlib 0.12),
    # "onednn" (oneDNN for the products XLA's rewriter supports, the weight gradients among
    # them), or "auto": a CPU run of 40+ steps compiles both and times 12 steps under each after
    # the allocator trial, keeping the faster; a resumed run keeps its checkpoint's choice.
    matmul_backend: str = "auto"


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """The `eval:` section: evaluate on the validation split every `every` steps (0: only at the
    end), over `batches` batches."""

    every: int = 100  # 0 = only at the end
    batches: int = 4


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """The `checkpoint:` section: save every `every` steps (and at the final step), keep the
    latest `max_to_keep`, save asynchronously, resume from the run directory's latest checkpoint,
    and save then stop cleanly on SIGTERM."""

    enabled: bool = True
    every: int = 100  # steps; the final step is always saved
    max_to_keep: int = 2
    async_save: bool = True
    resume: bool = True  # continue from the latest checkpoint in the run directory
    on_preemption: bool = True  # on SIGTERM: save a checkpoint, then stop cleanly


@dataclasses.dataclass(frozen=True)
class LogSection:
    """The `log:` section: the run directory, console and TensorBoard logging, the end-of-run
    report and its text sample, the device peak behind MFU, and the steps xprof-lite profiles
    (`profile_start`, `profile_steps`)."""

    run_dir: str | None = None  # default: runs/<UTC timestamp> under the working directory
    every: int = 10  # console lines / progress refresh; JSON lines get every step
    tensorboard: bool = True
    progress: str = "auto"  # "auto" (rich bar in a terminal), "rich" or "plain"
    report: bool = True
    sample_prompt: str = "def "
    sample_tokens: int = 64
    sample_temperature: float = 0.7  # 0 = greedy; sampling uses top-k 40 and train.seed
    peak_flops: float | None = None  # override the device peak used for MFU
    profile_start: int | None = None  # trace steps from here on into run_dir/profile (xprof-lite)
    profile_steps: int = 3


@dataclasses.dataclass(frozen=True)
class QuantSection:
    # QAT rules (extra `quant`): a jaxstack-quantlib preset (int8, w8a8, int4, nf4) or a YAML file
    rules: str | None = None


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "mesh": MeshConfig,
    "train": TrainSection,
    "eval": EvalSection,
    "checkpoint": CheckpointSection,
    "log": LogSection,
    "quant": QuantSection,
}
FREE_SECTIONS = ("model", "optim")  # checked by nnlib and optlib, see `_check_model/_optim`


@dataclasses.dataclass(frozen=True)
class Config:
    """A validated run configuration. `to_dict()` round-trips through `Config.from_dict`."""

    model: dict[str, Any]
    optim: dict[str, Any]
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    checkpoint: CheckpointSection = CheckpointSection()
    log: LogSection = LogSection()
    quant: QuantSection = QuantSection()
    name: str = "custom"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "model": dict(self.model)}
        out["optim"] = _plain(self.optim)
        for section in SECTIONS:
            out[section] = dataclasses.asdict(getattr(self, section))
        return out

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any], name: str = "custom") -> Config:
        if not isinstance(tree, Mapping):
            raise ConfigError(
                f"a config must be a mapping of sections (model:, optim:, train:, ...), got "
                f"{_kind(tree)}"
            )
        tree = dict(tree)
        name = str(tree.pop("name", name))
        unknown = set(tree) - set(SECTIONS) - set(FREE_SECTIONS)
        for key in sorted(unknown):
            raise ConfigError(_unknown_message(key, [*SECTIONS, *FREE_SECTIONS]))
        model = _check_model(_section("model", tree.get("model")))
        optim = _normalise_aliases("optim", _section("optim", tree.get("optim")))
        built = {s: build_section(s, cls_, tree.get(s) or {}) for s, cls_ in SECTIONS.items()}
        config = cls(model=model, optim=optim, name=name, **built)
        _check_values(config)
        return dataclasses.replace(config, optim=_check_optim(optim, config.train))

    def save(self, path: str | pathlib.Path) -> None:
        """Writes the config as YAML, atomically (a temporary name unique to this writer)."""
        path = pathlib.Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(self)}.tmp")
        tmp.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        tmp.replace(path)


def list_configs() -> list[str]:
    """Names of the YAML presets shipped with the trainer."""
    root = importlib.resources.files("jaxstack.trainer._src") / "presets"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_config(name_or_path: str = "tiny", overrides: Iterable[str] = ()) -> Config:
    """Reads a preset (by name) or a YAML file (by path), applies `key.sub=value` overrides.

    Raises ConfigError for an unknown preset (listing the presets), an unknown key (suggesting
    the nearest valid one), a malformed override or a value of the wrong type.
    """
    tree, name = _read(name_or_path)
    return Config.from_dict(apply_overrides(tree, overrides), name=name)


def apply_overrides(tree: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Sets each `section.key=value` override in a config tree, in order; returns the tree.

    For packages that extend the trainer's config with sections of their own (jaxstack-rl).
    """
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
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
    return key, parse_value(raw.strip())


def parse_value(raw: str) -> Any:
    """An override value, read by the same YAML loader as config files (`3e-4` is a float)."""
    try:
        return load_yaml(raw)
    except yaml.YAMLError:
        return raw


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
    """The trainer's one YAML reader (safe: no Python objects), for files and overrides alike."""
    return yaml.load(text, Loader=_Loader)


def _read(name_or_path: str) -> tuple[dict[str, Any], str]:
    path = pathlib.Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        return _read_file(path), path.stem
    names = list_configs()
    if name_or_path not in names:
        near = difflib.get_close_matches(name_or_path, names, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(
            f"unknown config preset {name_or_path!r}.{hint} Available presets: "
            f"{', '.join(names)}; or pass a path to a YAML file."
        )
    root = importlib.resources.files("jaxstack.trainer._src") / "presets"
    return load_yaml((root / f"{name_or_path}.yaml").read_text()) or {}, name_or_path


def _read_file(path: pathlib.Path) -> Any:
    fix = "pass a YAML mapping of sections (see --print-config) or a preset name"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not a text (UTF-8) file; {fix}") from None
    if "\x00" in text:
        raise ConfigError(f"config file {str(path)!r} is binary, not YAML; {fix}")
    try:
        tree = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}; {fix}") from None
    if tree is None:
        return {}
    if not isinstance(tree, Mapping):
        raise ConfigError(
            f"config file {str(path)!r} holds {_kind(tree)}, not a mapping of sections; {fix}"
        )
    return dict(tree)


def _kind(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "a list"
    return f"the {type(value).__name__} {value!r}"


def _section(section: str, values: Any) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ConfigError(
            f"config section {section!r} must be a mapping of keys to values, got "
            f"{_kind(values)}; e.g. {section}.<key>=<value> or '{section}: {{key: value}}'"
        )
    return dict(values)


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) < 2:
        raise ConfigError(
            f"override key {key!r} needs a section, e.g. model.{key} or train.{key}; sections: "
            f"{', '.join([*FREE_SECTIONS, *SECTIONS])}"
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


def _normalise_aliases(section: str, values: dict[str, Any]) -> dict[str, Any]:
    for alias, target in ALIASES.items():
        a_section, a_key = alias.split(".")
        t_key = target.split(".")[1]
        if a_section == section and a_key in values:
            if t_key in values:
                raise ConfigError(f"both {alias} and {target} are set; keep one")
            values[t_key] = values.pop(a_key)
    return values


def _unknown_message(key: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    leaf = key.rsplit(".", 1)[-1]
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    near = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.5)
    hint = f" Did you mean {prefix + near[0]!r}?" if near else ""
    return f"unknown config key {key!r}.{hint} Valid keys here: {', '.join(sorted(valid))}"


def build_section(section: str, cls: type, values: Mapping[str, Any]) -> Any:
    """`cls(**values)` for a dataclass section, with the trainer's key and type checks.

    An unknown key names the nearest valid one; a value of the wrong type names the key.
    """
    values = _section(section, values)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(_unknown_message(f"{section}.{key}", fields))
        kwargs[key] = _coerce(f"{section}.{key}", value, fields[key].type)
    return cls(**kwargs)


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Checks a value against a (string) annotation such as `int`, `float | None`, `str`.

    The one coercion rule of every section, the trainer's and the siblings' alike: an int
    where a float is declared becomes a float, nothing else is converted. Annotations other
    than int/float/bool/str (mappings, tuples, sibling configs) are left to the sibling's own
    checks.
    """
    names = [t.strip() for t in str(annotation).split("|")]
    if not any(n in _TYPES or n.startswith("dict") for n in names):
        return value
    if value is None:
        if "None" in names:
            return None
        raise ConfigError(f"{key} may not be null; give a {names[0]}")
    if any(n.startswith("dict") for n in names):
        if isinstance(value, Mapping):
            return dict(value)
        raise ConfigError(f"{key} must be a mapping, got {value!r}")
    for name in names:
        kind = _TYPES.get(name)
        if kind is None:
            continue
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
    raise ConfigError(f"{key} must be {' or '.join(names)}, got {value!r} ({type(value).__name__})")


def _check_model(model: dict[str, Any]) -> dict[str, Any]:
    """Keys, types and values of the model section, checked by building nnlib's ModelConfig."""
    from jaxstack import nnlib

    model.setdefault("preset", "tiny")
    base = nnlib_preset(model["preset"])
    fields = {f.name: f for f in dataclasses.fields(nnlib.ModelConfig)}
    for key, value in model.items():
        if key == "preset":
            continue
        if key not in fields:
            raise ConfigError(_unknown_message(f"model.{key}", [*fields, "preset"]))
        model[key] = _coerce(f"model.{key}", value, fields[key].type)
    try:
        base.replace(**{k: v for k, v in model.items() if k != "preset"})
    except (nnlib.Error, TypeError, ValueError) as e:
        raise ConfigError(f"model section is not valid for nnlib: {e}") from None
    return model


def nnlib_preset(name: Any) -> Any:
    """nnlib's preset `name`, or a ConfigError listing the presets."""
    from jaxstack import nnlib

    if isinstance(name, str) and name in nnlib.list_presets():
        return nnlib.get_preset(name)
    raise ConfigError(
        f"model.preset={name!r} is not an nnlib preset; available: "
        f"{', '.join(nnlib.list_presets())}"
    )


def _check_optim(optim: dict[str, Any], train: TrainSection) -> dict[str, Any]:
    """Keys, types and values of the optim section, checked by building optlib's config and
    schedule for a run of `train.steps` steps."""
    from jaxstack import optlib

    for section, cls in (("optim", optlib.OptimizerConfig), ("optim.schedule", None)):
        values = optim if cls else optim.get("schedule")
        if not isinstance(values, Mapping):
            continue
        fields = {f.name: f for f in dataclasses.fields(cls or optlib.ScheduleConfig)}
        for key, value in values.items():
            if key not in fields:
                extra = ["lr"] if section == "optim" else []
                raise ConfigError(_unknown_message(f"{section}.{key}", [*fields, *extra]))
            values[key] = _coerce(f"{section}.{key}", value, fields[key].type)
    if train.grad_accum > 1 and optim.get("accumulate_steps", 1) > 1:
        raise ConfigError(
            f"train.grad_accum={train.grad_accum} and optim.accumulate_steps="
            f"{optim['accumulate_steps']} both accumulate gradients; keep one (train.grad_accum "
            "splits each step's batch in the jitted step; optim.accumulate_steps applies an "
            "update every N steps)"
        )
    try:
        resolved = optimizer_config(optim, train.steps)
        schedule = resolved.schedule
        if (
            schedule.name not in ("constant", "warmup_constant")
            and schedule.total_steps
            and (schedule.warmup_steps >= schedule.total_steps)
        ):
            raise ConfigError(
                f"optim.schedule.warmup_steps={schedule.warmup_steps} leaves no steps to decay "
                f"over in a {schedule.total_steps}-step schedule (train.steps or "
                "optim.schedule.total_steps); make the warmup shorter or the run longer"
            )
        optlib.build_schedule(schedule, resolved.learning_rate)
    except ConfigError:
        raise
    except (optlib.Error, TypeError, ValueError) as e:
        # optlib names the field ("learning_rate must be >= 0.0"); say which section it is in.
        field = re.split(r"[ =.]", str(e), maxsplit=1)[0]
        known = {f.name for f in dataclasses.fields(optlib.OptimizerConfig)}
        raise ConfigError(f"optim.{e}" if field in known else f"optim: {e}") from None
    return optim


def optimizer_config(optim: Mapping[str, Any], steps: int) -> Any:
    """optlib `OptimizerConfig` of the optim section; the schedule's total_steps defaults to
    train.steps."""
    from jaxstack import optlib

    optim = dict(optim)
    schedule = dict(optim.get("schedule") or {})
    if schedule.get("total_steps") is None and schedule.get("name", "constant") != "constant":
        schedule["total_steps"] = steps
    if schedule:
        optim["schedule"] = schedule
    return optlib.OptimizerConfig.from_dict(optim)


def _check_values(config: Config) -> None:
    at_least = {
        "data.seq_len": (config.data.seq_len, 1),
        "data.batch_size": (config.data.batch_size, 1),
        "data.num_workers": (config.data.num_workers, 0),
        "data.prefetch": (config.data.prefetch, 1),
        "data.num_shards": (config.data.num_shards, 1),
        "train.steps": (config.train.steps, 1),
        "train.grad_accum": (config.train.grad_accum, 1),
        "train.z_loss_weight": (config.train.z_loss_weight, 0),
        "train.moe_load_balance_weight": (config.train.moe_load_balance_weight, 0),
        "train.moe_router_z_weight": (config.train.moe_router_z_weight, 0),
        "eval.every": (config.eval.every, 0),
        "eval.batches": (config.eval.batches, 1),
        "checkpoint.every": (config.checkpoint.every, 1),
        "checkpoint.max_to_keep": (config.checkpoint.max_to_keep, 1),
        "log.every": (config.log.every, 1),
        "log.sample_tokens": (config.log.sample_tokens, 0),
        "log.sample_temperature": (config.log.sample_temperature, 0),
        "log.profile_start": (config.log.profile_start, 0),
        "log.profile_steps": (config.log.profile_steps, 1),
    }
    for key, (value, low) in at_least.items():
        if value is not None and not value >= low:
            hint = " (0 turns it off)" if low == 0 and key.endswith("every") else ""
            raise ConfigError(f"{key} must be >= {low}{hint}, got {value}")
    if config.log.peak_flops is not None and not config.log.peak_flops > 0:
        raise ConfigError(
            f"log.peak_flops must be a positive FLOP/s figure or null (measured), got "
            f"{config.log.peak_flops}"
        )
    if config.data.batch_size % config.train.grad_accum:
        accum = config.train.grad_accum
        example = accum * max(1, config.data.batch_size // accum)
        raise ConfigError(
            f"data.batch_size={config.data.batch_size} is not divisible by "
            f"train.grad_accum={config.train.grad_accum}; pick a batch_size that is a multiple "
            f"of grad_accum (e.g. {example})"
        )
    choices = {
        "log.progress": (config.log.progress, ("auto", "rich", "plain")),
        "train.host_allocator": (config.train.host_allocator, ("auto", "retain", "system")),
        "train.matmul_backend": (config.train.matmul_backend, ("auto", "default", "onednn")),
        "train.attention": (config.train.attention, ("xla", "kernlib")),
    }
    for key, (value, valid) in choices.items():
        if value not in valid:
            raise ConfigError(f"{key} must be one of {', '.join(valid)}; got {value!r}")
    axes = [config.mesh.data, config.mesh.fsdp, config.mesh.tensor, config.mesh.expert]
    if sum(a == -1 for a in axes) > 1:
        raise ConfigError("at most one mesh axis may be -1 (fill the remaining devices)")
    if any(a == 0 or a < -1 for a in axes):
        raise ConfigError(f"mesh axes must be positive or -1, got {axes}")


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
