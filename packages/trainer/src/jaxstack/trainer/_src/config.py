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
import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from jaxstack.trainer._src.errors import ConfigError
from jaxstack.trainer._src.schema import (
    Section,
    apply_overrides,
    checked_keys,
    dump_yaml,
    explain,
    json_schema,
    kind_of,
    load_yaml,
    read_yaml_file,
    section_of_dataclass,
    validate_config,
)


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
        if sum(a == -1 for a in axes) > 1:
            raise ConfigError("at most one mesh axis may be -1 (fill the remaining devices)")
        if any(a == 0 or a < -1 for a in axes):
            raise ConfigError(f"mesh axes must be positive or -1, got {axes}")
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

    every: int = Field(100, ge=0, json_schema_extra={"hint": "0 turns it off"})
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
    peak_flops: float | None = None
    """Device peak FLOP/s behind MFU; null: measured."""
    profile_start: int | None = Field(None, ge=0)
    """Trace steps from this one on into run_dir/profile (xprof-lite); null: no trace."""
    profile_steps: int = Field(3, ge=1)
    """Steps traced."""

    @field_validator("peak_flops")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ValueError("must be a positive FLOP/s figure or null (measured)")
        return value


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

    error: ClassVar[type[Exception]] = ConfigError
    schema_title: ClassVar[str] = "jaxstack-train run config"

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any], name: str = "custom") -> Config:
        """Validates a config tree (as read from YAML); raises `cls.error` naming the key."""
        if not isinstance(tree, Mapping):
            raise cls.error(
                f"a config must be a mapping of sections (model:, optim:, train:, ...), got "
                f"{kind_of(tree)}"
            )
        tree = {k: v for k, v in tree.items() if v is not None}
        tree.setdefault("name", name)
        tree["name"] = str(tree["name"])
        return validate_config(cls, tree, error=cls.error)

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        """The JSON Schema of a config file (`--print-schema`), the siblings' `model` and `optim`
        keys included, for editors that complete and check YAML."""
        from jaxstack import nnlib, optlib

        schema = json_schema(cls, cls.schema_title)
        props = schema["properties"]
        model = _model_section().model_json_schema()["properties"]
        for field in model.values():
            field.pop("default", None)  # the preset's values are the defaults
        model["preset"] = {"enum": nnlib.list_presets(), "default": "tiny"}
        props["model"].update(properties=model, additionalProperties=False)
        optim = optlib.OptimizerConfig.model_json_schema()
        schema["$defs"].update(optim["$defs"])
        schema["$defs"]["ScheduleConfig"]["properties"]["total_steps"]["description"] += (
            " In a run config, null: train.steps."
        )
        lr = {"type": "number", "description": "Short for learning_rate."}
        props["optim"].update(
            properties={"lr": lr, **optim["properties"]}, additionalProperties=False
        )
        return schema

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the config as YAML, atomically."""
        dump_yaml(self.to_dict(), path)

    @field_validator("model")
    @classmethod
    def _model(cls, model: dict[str, Any]) -> dict[str, Any]:
        """Keys and types of the model section, then nnlib builds its ModelConfig."""
        from jaxstack import nnlib

        model = {"preset": "tiny", **model}
        base = nnlib_preset(model["preset"])
        fields = {k: v for k, v in model.items() if k != "preset"}
        model.update(checked_keys(_model_section(), model, "model"))
        try:
            base.replace(**{k: model[k] for k in fields})
        except (nnlib.Error, TypeError, ValueError) as e:
            raise ConfigError(f"model section is not valid for nnlib: {e}") from None
        return model

    @field_validator("optim")
    @classmethod
    def _optim(cls, optim: dict[str, Any]) -> dict[str, Any]:
        """`lr` stands for `learning_rate`; optlib checks the section with train.steps below."""
        optim = dict(optim)
        if "lr" in optim:
            if "learning_rate" in optim:
                raise ConfigError("both optim.lr and optim.learning_rate are set; keep one")
            optim["learning_rate"] = optim.pop("lr")
        return optim

    @model_validator(mode="after")
    def _together(self) -> Config:
        """Checks that need two sections: the optimiser, accumulation, batch divisibility."""
        resolved = _check_optimizer(self.optim, self.train.steps)
        accum = self.train.grad_accum
        if accum > 1 and resolved.accumulate_steps > 1:
            raise ConfigError(
                f"train.grad_accum={accum} and optim.accumulate_steps="
                f"{resolved.accumulate_steps} both accumulate gradients; keep one "
                "(train.grad_accum splits each step's batch in the jitted step; "
                "optim.accumulate_steps applies an update every N steps)"
            )
        if self.data.batch_size % accum:
            raise ConfigError(
                f"data.batch_size={self.data.batch_size} is not divisible by "
                f"train.grad_accum={accum}; pick a batch_size that is a multiple of grad_accum "
                f"(e.g. {accum * max(1, self.data.batch_size // accum)})"
            )
        return self


@functools.cache
def _model_section() -> type[Section]:
    """The Section of nnlib's ModelConfig dataclass, plus `preset`."""
    from jaxstack import nnlib

    return section_of_dataclass(nnlib.ModelConfig, "model", preset=str)


def _check_optimizer(optim: Mapping[str, Any], steps: int) -> Any:
    """optlib's `OptimizerConfig` of the optim section of a `steps`-step run (errors name the
    `optim.` key), with steps left to decay over after the warmup."""
    from jaxstack import optlib

    try:
        resolved = optlib.OptimizerConfig.model_validate(_with_total_steps(optim, steps))
    except ValidationError as e:
        error = e.errors()[0]
        cause = (error.get("ctx") or {}).get("error")
        if not isinstance(cause, optlib.Error):
            raise ConfigError(explain(optlib.OptimizerConfig, error, "optim")) from None
        # optlib's own rule, worded with its field first ("b1 must be < 1 ..."): say the section
        known = re.split(r"[ =.\[:]", str(cause))[0] in optlib.OptimizerConfig.model_fields
        raise ConfigError(f"optim.{cause}" if known else f"optim: {cause}") from None
    schedule = resolved.schedule
    total = schedule.total_steps
    if schedule.name != "constant" and total is not None and schedule.warmup_steps >= total:
        raise ConfigError(
            f"optim.schedule.warmup_steps={schedule.warmup_steps} leaves no steps to decay over "
            f"in a {total}-step schedule (train.steps or optim.schedule.total_steps); make the "
            "warmup shorter or the run longer"
        )
    return resolved


def _with_total_steps(optim: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """The optim section with the schedule's total_steps defaulting to train.steps."""
    optim = dict(optim)
    schedule = optim.get("schedule")
    if isinstance(schedule, str):
        schedule = {"name": schedule}
    if isinstance(schedule, Mapping) and schedule.get("name", "constant") != "constant":
        total = schedule.get("total_steps")
        optim["schedule"] = {**schedule, "total_steps": steps if total is None else total}
    return optim


def optimizer_config(optim: Mapping[str, Any], steps: int) -> Any:
    """optlib `OptimizerConfig` of the optim section; the schedule's total_steps defaults to
    train.steps."""
    from jaxstack import optlib

    return optlib.OptimizerConfig.from_dict(_with_total_steps(optim, steps))


def nnlib_preset(name: Any) -> Any:
    """nnlib's preset `name`, or a ConfigError listing the presets."""
    from jaxstack import nnlib

    if isinstance(name, str) and name in nnlib.list_presets():
        return nnlib.get_preset(name)
    raise ConfigError(
        f"model.preset={name!r} is not an nnlib preset; available: "
        f"{', '.join(nnlib.list_presets())}"
    )


def list_configs() -> list[str]:
    """Names of the YAML presets shipped with the trainer."""
    root = importlib.resources.files("jaxstack.trainer._src") / "presets"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_config(name_or_path: str = "tiny", overrides: Iterable[str] = ()) -> Config:
    """Reads a preset (by name) or a YAML file (by path), applies `key.sub=value` overrides.

    Raises ConfigError for an unknown preset (listing the presets), an unknown key (suggesting
    the nearest valid one), a malformed override or a value of the wrong type or range.
    """
    tree, name = read_config_tree(name_or_path, "jaxstack.trainer._src", list_configs())
    return Config.from_dict(apply_overrides(tree, overrides), name=name)


def read_config_tree(
    name_or_path: str, package: str, presets: list[str], error: type[Exception] = ConfigError
) -> tuple[dict[str, Any], str]:
    """The tree of a YAML file (by path) or of a preset of `package` (by name), and its name."""
    path = os.fspath(name_or_path)
    if path.endswith((".yaml", ".yml")) or os.path.isfile(path):
        return read_yaml_file(path, error), os.path.splitext(os.path.basename(path))[0]
    if name_or_path not in presets:
        near = difflib.get_close_matches(name_or_path, presets, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise error(
            f"unknown config preset {name_or_path!r}.{hint} Available presets: "
            f"{', '.join(presets)}; or pass a path to a YAML file."
        )
    root = importlib.resources.files(package) / "presets"
    return load_yaml((root / f"{name_or_path}.yaml").read_text()) or {}, name_or_path
