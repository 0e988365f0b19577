"""Run configuration: YAML presets and dotted overrides, validated by one schema.

A run is one nested mapping with nine sections. The trainer declares seven of them (`data`,
`mesh`, `train`, `eval`, `checkpoint`, `log`, `quant`) as `Section` models below: each field's
type, default, range and docstring are the schema (`jaxstack-train --print-schema`, the
reference page docs/reference/config.md). The other two belong to sibling packages and are
checked against *their* declarations, so each field has one source of truth:

- `model`: `preset` (an nnlib preset name) plus any `jaxstack.nnlib.ModelConfig` field;
- `optim`: any field of optlib's pydantic `OptimizerConfig` (`lr` is accepted for
  `learning_rate`), with `schedule` a nested mapping of `ScheduleConfig` fields whose
  `total_steps` defaults to `train.steps`; optlib's models validate it.

The machinery is optlib's, shared by every package's config: `Section` is its `ConfigModel`
(frozen, strict, no unknown keys; `from_dict` words pydantic's first error as one line: the
dotted key, pydantic's own message and the bad value, or for an unknown key the nearest valid
one), and its YAML reader (YAML 1.2 floats: `3e-4` is a number) reads files and override values.
This module adds presets and dotted overrides.

`load_config("tiny", ["model.num_layers=2", "optim.lr=3e-4"])` reads a preset (or a YAML file),
applies the overrides in order and validates the result; a bad key or value is one line naming
the key and the fix before anything runs. The resolved config is written next to every run
(`config.yaml`) so a run can be repeated with `--config` on it.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import os
import pathlib
import typing
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal

import pydantic
import yaml
from pydantic import Field, field_validator, model_validator

from jaxstack import optlib
from jaxstack.trainer._src.errors import ConfigError


class Section(optlib.ConfigModel):
    """Base of every config section: optlib's `ConfigModel` (strict types, no unknown keys,
    immutable; a field's docstring is its description), raising the trainer's ConfigError."""

    error: ClassVar[type[Exception]] = ConfigError


def list_configs(package: str = __package__) -> list[str]:
    """Names of the YAML presets shipped in `package`'s `presets` folder (the trainer's)."""
    root = importlib.resources.files(package) / "presets"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def read_config_tree(name_or_path: str, package: str = __package__) -> tuple[dict, str]:
    """The tree of a YAML file (by path) or of a preset of `package` (by name), and its name.
    A preset's relative `data.path` (its own records, in presets/data/) is made absolute."""
    path, presets = os.fspath(name_or_path), list_configs(package)
    root = pathlib.Path(str(importlib.resources.files(package) / "presets"))
    preset = not path.endswith((".yaml", ".yml")) and not os.path.isfile(path)
    if preset and path not in presets:
        near = "".join(f" Did you mean {p!r}?" for p in difflib.get_close_matches(path, presets, 1))
        raise ConfigError(f"unknown config preset {path!r}.{near} Presets: {', '.join(presets)}")
    tree = optlib.read_yaml_file(root / f"{path}.yaml" if preset else path, ConfigError)
    if not isinstance(tree, Mapping | None):
        raise ConfigError(f"config file {path!r} holds {tree!r}, not a mapping of sections")
    tree = dict(tree or {})
    if preset and isinstance(tree.get("data"), dict) and "path" in tree["data"]:
        tree["data"]["path"] = str(root / tree["data"]["path"])
    return tree, pathlib.Path(path).stem


# ---- dotted overrides ----

_ALIASES = {"optim.lr": "optim.learning_rate"}  # optlib's: an override replaces either name


def apply_overrides(tree: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Sets each `section.key=value` override in a config tree, in order; returns the tree."""
    for item in overrides:
        key, value = parse_override(item)
        *sections, leaf = key.split(".")
        node = tree
        for part in sections:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node := node[part], dict):
                raise ConfigError(f"cannot set {key!r}: {part!r} is a value, not a section")
        for alias in (a for a, name in _ALIASES.items() if name == key):
            node.pop(alias.rpartition(".")[2], None)
        node[leaf] = value
    return tree


def parse_override(item: str) -> tuple[str, Any]:
    """`"optim.lr=3e-4"` -> `("optim.learning_rate", 0.0003)`; values parse as YAML scalars."""
    key, _, raw = (part.strip() for part in item.partition("="))
    key = _ALIASES.get(key, key)
    if not key or "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form section.key=value (optim.lr=3)")
    try:
        return key, optlib.load_yaml(raw)
    except yaml.YAMLError:
        return key, raw


# ---- the trainer's sections ----


class DataConfig(Section):
    """Where tokens come from and how they are batched. `batch_size` is the *global* number of
    sequences per optimiser step (all devices, all accumulation micro-steps), so changing the
    mesh never changes the maths."""

    path: str | None = None
    """Text file or folder of .txt files; null: datalib's default corpus."""
    validation_path: str | None = None
    """Evaluation text; null: the training files."""
    tokenizer: str = "byte"
    """"byte", or the path of a BPE tokenizer JSON file."""
    vocab_from_tokenizer: bool = True
    """The model's vocab_size follows the tokenizer unless model.vocab_size is set (real-size
    presets turn this off to keep their published vocabulary)."""
    seq_len: int = Field(256, ge=1)
    """Tokens per sequence."""
    batch_size: int = Field(8, ge=1)
    """Sequences per optimiser step, over all devices and accumulation micro-steps."""
    packing: str = "first_fit"
    """How documents are packed into sequences (datalib's packer name)."""
    num_workers: int = Field(0, ge=0)
    """Data-loading worker processes (0: in the training process)."""
    seed: int = 0
    """Seed of the data order."""
    num_shards: int | None = Field(None, ge=1)
    """Data shards the global batch is cut into; null: one per process (must be a multiple of
    the process count)."""
    prefetch: int = Field(2, ge=1)
    """Device batches kept ready by a background thread."""


class MeshConfig(Section):
    """Device mesh axes; one axis may be -1 to take the remaining devices."""

    data: int = -1
    """Data-parallel axis."""
    fsdp: int = 1
    """Fully-sharded data-parallel axis (parameters and optimiser state sharded)."""
    tensor: int = 1
    """Tensor-parallel axis."""
    expert: int = 1
    """Expert-parallel axis (mixture-of-experts models)."""
    rules: dict[str, Any] | None = None
    """Overrides of the default logical-axis rules (`jaxstack.trainer.DEFAULT_RULES`)."""

    @model_validator(mode="after")
    def _axes(self) -> MeshConfig:
        axes = [self.data, self.fsdp, self.tensor, self.expert]
        if axes.count(-1) > 1 or any(a == 0 or a < -1 for a in axes):
            raise ConfigError(f"mesh axes must be positive or -1 (at most one), got {axes}")
        return self


class TrainSection(Section):
    """Steps, gradient accumulation, seed, loss weights, buffer donation, and the host-side
    speed settings (attention implementation, XLA flags, compile cache, allocator, matmuls)."""

    steps: int = Field(300, ge=1)
    """Optimiser steps of the run."""
    grad_accum: int = Field(1, ge=1)
    """Micro-steps each step's batch is split into (inside the jitted step)."""
    seed: int = 0
    """Seed of parameter initialisation and sampling."""
    z_loss_weight: float = Field(0.0, ge=0)
    """Weight of the z-loss (log of the softmax normaliser, squared)."""
    moe_load_balance_weight: float = Field(0.01, ge=0)
    """Weight of the mixture-of-experts load-balancing loss."""
    moe_router_z_weight: float = Field(0.001, ge=0)
    """Weight of the mixture-of-experts router z-loss."""
    donate: bool = True
    """Donate the training state's buffers to the step (halves its memory)."""
    attention: Literal["xla", "kernlib"] = "xla"
    """Attention implementation: XLA's, or kernlib's (extra `kernels`)."""
    xla_flags: str | None = None
    """XLA flags added before JAX starts, e.g.
    "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise" (see benchmarks/train)."""
    compile_cache: str | None = "~/.cache/jaxstack/jax"
    """JAX's persistent compilation cache: a restarted run skips recompiling; null: off."""
    host_allocator: Literal["auto", "retain", "system"] = "auto"
    """"retain": glibc keeps freed host memory for the next step; "system": malloc's own
    behaviour; "auto": a run of 40+ steps times both and keeps the faster."""
    matmul_backend: Literal["auto", "default", "onednn"] = "auto"
    """XLA:CPU matmul kernels: "default" (XLA's own), "onednn", or "auto" (a CPU run of 40+
    steps times both and keeps the faster; a resumed run keeps its checkpoint's choice)."""


class EvalSection(Section):
    """Evaluation on the validation split."""

    every: int = Field(100, ge=0)
    """Evaluate every this many steps; 0: only at the end."""
    batches: int = Field(4, ge=1)
    """Batches per evaluation."""


class CheckpointSection(Section):
    """Checkpoints: how often, how many, asynchronous saving, resuming, preemption."""

    enabled: bool = True
    """Save checkpoints at all."""
    every: int = Field(100, ge=1)
    """Save every this many steps; the final step is always saved."""
    max_to_keep: int = Field(2, ge=1)
    """Checkpoints kept (the latest ones)."""
    async_save: bool = True
    """Write checkpoints in the background while training goes on."""
    resume: bool = True
    """Continue from the latest checkpoint in the run directory."""
    on_preemption: bool = True
    """On SIGTERM: save a checkpoint, then stop cleanly."""


class LogSection(Section):
    """The run directory, console and TensorBoard logging, the end-of-run report, the device
    peak behind MFU, and the steps xprof-lite profiles."""

    run_dir: str | None = None
    """Run directory; null: runs/<UTC timestamp> under the working directory."""
    every: int = Field(10, ge=1)
    """Console lines and progress refresh every this many steps (JSON lines get every step)."""
    tensorboard: bool = True
    """Write TensorBoard event files."""
    progress: Literal["auto", "rich", "plain"] = "auto"
    """Progress display: "auto" (a rich bar in a terminal), "rich" or "plain"."""
    report: bool = True
    """Write the HTML report at the end of the run."""
    sample_prompt: str = "def "
    """Prompt of the text sample in the report."""
    sample_tokens: int = Field(64, ge=0)
    """Tokens of the text sample."""
    sample_temperature: float = Field(0.7, ge=0)
    """Sampling temperature (0: greedy; sampling uses top-k 40 and train.seed)."""
    peak_flops: float | None = Field(None, gt=0)
    """Device peak FLOP/s behind MFU; null: measured."""
    profile_start: int | None = Field(None, ge=0)
    """Trace steps from this one on into run_dir/profile (xprof-lite); null: no trace."""
    profile_steps: int = Field(3, ge=1)
    """Steps traced."""


class QuantSection(Section):
    """Quantisation-aware training (extra `quant`)."""

    rules: str | None = None
    """A jaxstack-quantlib preset (int8, w8a8, int4, nf4) or a YAML rules file; null: off."""


class Config(Section):
    """A validated run configuration; `to_dict()` validates back to an equal one."""

    name: str = "custom"
    """The config's name (the preset's, or the file's stem)."""
    model: dict[str, Any] = Field(default_factory=dict)
    """`preset` (an nnlib preset) and any `jaxstack.nnlib.ModelConfig` field."""
    optim: dict[str, Any] = Field(default_factory=dict)
    """Any `jaxstack.optlib.OptimizerConfig` field (`lr` for `learning_rate`); `schedule` holds
    `ScheduleConfig` fields, its `total_steps` train.steps unless set."""
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    checkpoint: CheckpointSection = CheckpointSection()
    log: LogSection = LogSection()
    quant: QuantSection = QuantSection()

    schema_title: ClassVar[str] = "jaxstack-train run config"
    _optimizer: Any = pydantic.PrivateAttr(None)

    @property
    def optimizer(self) -> Any:
        """optlib's `OptimizerConfig` of the optim section, as validated with the config (the
        schedule's `total_steps` is train.steps unless set)."""
        return self._optimizer

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any], name: str = "custom") -> Config:
        """Validates a config tree (as read from YAML); raises `cls.error` naming the key."""
        if not isinstance(tree, Mapping):
            raise cls.error(f"a config must be a mapping of sections (train:, ...), got {tree!r}")
        tree = {"name": name} | {k: v for k, v in tree.items() if v is not None}
        return super().from_dict({**tree, "name": str(tree["name"])})

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        """The JSON Schema of a config file (`--print-schema`), the siblings' `model` and `optim`
        keys included, for editors that complete and check YAML."""
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
        schema |= cls.model_json_schema() | {"title": cls.schema_title}
        model = _model_section().model_json_schema()["properties"]
        for field in [*model.values()][1:]:  # but `preset`: the preset's values are the defaults
            field.pop("default", None)
        optim = optlib.OptimizerConfig.model_json_schema()
        schema["$defs"] |= optim["$defs"]
        lr = {"lr": {"type": "number", "description": "Short for learning_rate."}}
        for key, fields in ("model", model), ("optim", lr | optim["properties"]):
            schema["properties"][key] |= {"properties": fields, "additionalProperties": False}
        return schema

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the config as YAML, atomically (ckptlib's `atomic_file`: a full disk or a
        crash leaves the previous file), creating the folder if needed."""
        from jaxstack import ckptlib

        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        with ckptlib.atomic_file(path) as tmp:
            tmp.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @field_validator("model")
    @classmethod
    def _model(cls, model: dict[str, Any]) -> dict[str, Any]:
        """Keys and plain types here, then nnlib's own checks of the preset with the fields."""
        from jaxstack import nnlib

        checked = _model_section().from_dict({"preset": "tiny", **model}, "model")
        fields = {k: getattr(checked, k) for k in model if k != "preset"}
        try:
            nnlib.get_preset(checked.preset).replace(**fields)
        except (nnlib.Error, TypeError, ValueError) as e:
            raise ConfigError(f"model: {e}") from None
        return {"preset": checked.preset, **fields}

    @model_validator(mode="after")
    def _together(self) -> Config:
        """optlib validates the optim section (kept as `optimizer`) over a run of train.steps;
        then the checks that need two sections."""
        accum, schedule = self.train.grad_accum, self.optim.get("schedule", {})
        optim = {**self.optim, "schedule": _fit_schedule(schedule, self.train.steps)}
        self._optimizer = resolved = optlib.OptimizerConfig.from_dict(optim, "optim")
        if accum > 1 and (n := resolved.accumulate_steps) > 1:
            raise ConfigError(
                f"train.grad_accum={accum} and optim.accumulate_steps={n} both accumulate; keep one"
            )
        if (batch := self.data.batch_size) % accum:
            raise ConfigError(
                f"data.batch_size={batch} is not a multiple of train.grad_accum={accum}"
            )
        return self


def _fit_schedule(schedule: Any, steps: int) -> Any:
    """The schedule over a run of `steps` steps: its `total_steps` (where a decay ends, what
    `warmup_ratio` is a share of) is the run's unless set; a warmup as long as the run or longer
    (a preset's, in a short run) becomes a tenth of it, with a warning, not an error."""
    schedule = {"name": schedule} if isinstance(schedule, str) else schedule
    if not isinstance(schedule, Mapping):
        return schedule  # optlib names what is wrong
    decays = schedule.get("name", "constant") != "constant"
    if (decays or "warmup_ratio" in schedule) and schedule.get("total_steps") is None:
        schedule = {**schedule, "total_steps": steps}
    warmup, total = schedule.get("warmup_steps", 0), schedule.get("total_steps") or steps
    numbers = type(warmup) is int and type(total) is int  # else optlib names the bad value
    if numbers and "warmup_ratio" not in schedule and warmup >= total + (not decays):
        warnings.warn(
            f"optim.schedule.warmup_steps={warmup} is not shorter than the {total}-step run; "
            f"using {total // 10} (a tenth of it). Set optim.schedule.warmup_ratio (a share of "
            "the run) or warmup_steps to choose.",
            stacklevel=2,
        )
        schedule = {**schedule, "warmup_steps": total // 10}
    return schedule


@functools.cache
def _model_section() -> type[Section]:
    """nnlib's ModelConfig fields (of plain types checked here, the rest by nnlib) and `preset`."""
    from jaxstack import nnlib

    plain = {int, float, bool, str, type(None)}
    fields = {
        k: (t if set(typing.get_args(t) or [t]) <= plain else Any, None)
        for k, t in typing.get_type_hints(nnlib.ModelConfig).items()
    }
    preset = (Literal[tuple(nnlib.list_presets())], "tiny")
    return pydantic.create_model("ModelSection", __base__=Section, preset=preset, **fields)


def load_config(name_or_path: str = "tiny", overrides: Iterable[str] = ()) -> Config:
    """Reads a preset (by name) or a YAML file (by path), applies `key.sub=value` overrides.

    Raises ConfigError for an unknown preset (listing the presets), an unknown key (suggesting
    the nearest valid one), a malformed override or a value of the wrong type or range.
    """
    tree, name = read_config_tree(name_or_path)
    return Config.from_dict(apply_overrides(tree, overrides), name=name)
