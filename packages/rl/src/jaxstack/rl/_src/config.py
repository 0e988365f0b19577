"""Post-training run configuration: the trainer's config plus one section per RL concern.

`RLConfig` extends `jaxstack.trainer.Config` (sections `model`, `optim`, `data`, `mesh`,
`train`, `eval`, `checkpoint`, `log`, `quant`) with the sections below, declared the trainer's
way (`jaxstack.trainer.Section`: typed, ranged, documented; `jaxstack-rl --print-schema`):

- `init`: the weights to start from (a jaxstack run directory, or an HF folder);
- `lora`: adapter rank, alpha, target pattern (rank 0 = full fine-tuning);
- `sft`, `dpo`, `orpo`, `grpo`, `ppo`: each algorithm's hyper-parameters;
- `rollout`: how completions are sampled for GRPO and PPO, and what a raising reward does;
- `rewards`: `{"module:function": weight}` reward functions for GRPO and PPO;
- `roles`: the devices and mesh of each role of GRPO and PPO (actor, reference, rollout).

Meanings of the shared sections in post-training: `data.path` is the JSONL records file,
`data.batch_size` the sequences per step for SFT, pairs per step for DPO/ORPO and prompts per
iteration for GRPO/PPO; `train.steps` counts optimiser steps (SFT, DPO, ORPO) or iterations
(GRPO, PPO).
"""

from __future__ import annotations

import pathlib
import warnings
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from jaxstack import trainer
from jaxstack.rl._src.errors import ConfigError

ALGORITHMS = ("sft", "dpo", "orpo", "grpo", "ppo")
"""The post-training algorithms, one `jaxstack-rl` subcommand and config section each."""

TRAINER_ONLY = (
    *("data.validation_path", "data.vocab_from_tokenizer", "data.num_workers", "data.num_shards"),
    *("data.prefetch", "train.donate", "train.attention", "train.matmul_backend", "eval.batches"),
    *("log.sample_prompt", "log.sample_tokens", "log.sample_temperature", "log.peak_flops"),
    *("log.profile_start", "log.profile_steps", "quant.rules"),
)
"""The trainer's settings that no post-training algorithm reads: a value other than the default
is an error, not a setting that silently does nothing (rl's schema leaves them out)."""
SFT_ONLY = (
    *("data.packing", "train.grad_accum", "train.z_loss_weight"),
    *("train.moe_load_balance_weight", "train.moe_router_z_weight"),
)
"""The trainer's settings that SFT reads (it trains with the trainer's loss and step) and the
other algorithms, with losses and batches of their own, do not."""

HF_COMPUTE_FIELDS = ("dtype", "param_dtype", "remat", "moe_impl")
"""The `model.*` fields that apply to an `init.hf` model, whose config.json defines the rest:
how it computes, not what it is."""


class InitSection(trainer.Section):
    """Starting weights; neither set = a freshly initialised model (seeded by train.seed)."""

    checkpoint: str | None = None
    """A jaxstack-train or jaxstack-rl run directory, or its `checkpoints` folder (the latest
    step's params)."""
    hf: str | None = None
    """A Hugging Face model folder (its tokenizer becomes data.tokenizer unless that is set)."""


class LoraSection(trainer.Section):
    """LoRA adapters on the modules whose paths match `pattern`; QLoRA with `quantize`."""

    rank: int = Field(0, ge=0)
    """Adapter rank; 0: full fine-tuning."""
    alpha: float | None = Field(None, gt=0)
    """Adapter scale numerator; null: the rank (scale 1)."""
    pattern: str = r"(attn/(q|k|v|o)_proj|mlp/(gate|up|down)_proj)$"
    """Regex of the parameter paths that get adapters."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""
    quantize: str | None = None
    """QLoRA: store the frozen base weights in this quantlib format ("nf4", "int4", "int8";
    the output head stays float; extra `qlora`); null: full-precision base."""
    quantize_tile: int = Field(64, ge=1)
    """Quantisation block size along the input features."""


class SftSection(trainer.Section):
    """Supervised fine-tuning on chat records."""

    chat_template: str | None = None
    """A tokenizer_config.json (or its folder); null: the model's own or the built-in one."""
    train_on: Literal["assistant", "all"] = "assistant"
    """Which tokens the loss covers: the assistant's replies, or all."""


class DpoSection(trainer.Section):
    """Direct preference optimisation."""

    beta: float = Field(0.1, ge=0)
    """The KL strength."""
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    """cDPO's assumed label-noise rate."""
    reference: Literal["precompute", "live"] = "precompute"
    """The frozen reference's log-probs: computed once before training, or each step."""


class OrpoSection(trainer.Section):
    """Odds-ratio preference optimisation."""

    beta: float = Field(0.1, ge=0)
    """Weight of the odds-ratio term (the paper's lambda)."""


class RolloutSection(trainer.Section):
    """How GRPO and PPO sample completions."""

    group_size: int = Field(8, ge=2)
    """Completions sampled per prompt."""
    max_new_tokens: int = Field(32, ge=1)
    """Longest completion, in tokens."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (GRPO and PPO learn from sampled completions)."""
    top_k: int | None = Field(None, ge=1)
    """Sample among the k likeliest tokens; null: all."""
    on_reward_error: Literal["stop", "skip"] = "stop"
    """A raising reward function: "stop" the run, or "skip" the completion (no gradient)."""


class GrpoSection(trainer.Section):
    """Group relative policy optimisation."""

    clip_eps: float = Field(0.2, ge=0)
    """Clipping range of the probability ratio."""
    kl_coef: float = Field(0.04, ge=0)
    """Weight of the KL penalty to the reference."""
    updates_per_iteration: int = Field(1, ge=1)
    """Optimiser steps on each batch of rollouts (mu)."""
    loss_type: Literal["grpo", "dr_grpo"] = "grpo"
    """"grpo": token mean per completion; "dr_grpo": token sum over completions x
    max_new_tokens."""
    scale_rewards: bool = True
    """Divide advantages by the group's standard deviation (false: Dr. GRPO)."""


class PpoSection(trainer.Section):
    """Proximal policy optimisation with a value head and GAE."""

    clip_eps: float = Field(0.2, ge=0)
    """Clipping range of the probability ratio."""
    value_clip_eps: float = Field(0.2, ge=0)
    """Clipping range of the value update."""
    value_coef: float = Field(0.1, ge=0)
    """Weight of the value loss."""
    kl_coef: float = Field(0.05, ge=0)
    """Per-token KL penalty folded into the rewards."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount factor."""
    lam: float = Field(0.95, ge=0, le=1)
    """GAE's lambda."""
    updates_per_iteration: int = Field(2, ge=1)
    """Optimiser steps on each batch of rollouts."""


class RolePlacement(trainer.Section):
    """Where one role's arrays live."""

    devices: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=1)
    """Indices into `jax.devices()`; null: all of them."""
    mesh: trainer.MeshConfig | None = None
    """Mesh axes over those devices; null: the run's `mesh` section."""

    @field_validator("devices")
    @classmethod
    def _distinct(cls, devices: list[int] | None) -> list[int] | None:
        if devices and len(set(devices)) != len(devices):
            raise ValueError("the device indices must be distinct")
        return devices


class RolesSection(trainer.Section):
    """GRPO's and PPO's roles (PPO's critic is a value head on the actor's trunk, so it lives
    with the actor). Whether they fit this host is checked at run start."""

    actor: RolePlacement = RolePlacement()
    """Trained params, optimiser state, update step."""
    reference: RolePlacement = RolePlacement()
    """Frozen starting params and their log-probs."""
    rollout: RolePlacement = RolePlacement()
    """The rollout engine."""


class RLConfig(trainer.Config):
    """A validated post-training config: the trainer's sections and ours."""

    algorithm: Literal[ALGORITHMS] = "sft"  # type: ignore[valid-type]
    """The algorithm (the `jaxstack-rl` sub-command)."""
    init: InitSection = InitSection()
    lora: LoraSection = LoraSection()
    sft: SftSection = SftSection()
    dpo: DpoSection = DpoSection()
    orpo: OrpoSection = OrpoSection()
    rollout: RolloutSection = RolloutSection()
    grpo: GrpoSection = GrpoSection()
    ppo: PpoSection = PpoSection()
    roles: RolesSection = RolesSection()
    rewards: dict[str, float] = Field(default_factory=dict)
    """Reward functions of GRPO and PPO: `"module:function": weight`."""

    error: ClassVar[type[Exception]] = ConfigError
    schema_title: ClassVar[str] = "jaxstack-rl run config"

    @property
    def base(self) -> RLConfig:
        """The trainer's part: this config itself (kept for code written for rl 0.5)."""
        return self

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any], algorithm: str | None = None) -> RLConfig:
        """Validates a config tree; `algorithm` (the sub-command) wins over the tree's. An
        `init.hf` model's own tokenizer is `data.tokenizer` unless that is set."""
        tree = {**tree, "algorithm": algorithm or tree.get("algorithm")}
        init, data = tree.get("init"), tree.get("data") or {}
        hf = init.get("hf") if isinstance(init, Mapping) else None
        if hf and isinstance(data, Mapping) and "tokenizer" not in data:
            tree["data"] = {**data, "tokenizer": hf}
        name = tree.get("name") or tree["algorithm"]
        return super().from_dict(tree, name=str(name))

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        """The trainer's schema without the settings no algorithm reads (`TRAINER_ONLY`)."""
        schema = super().config_schema()
        for section, field in (key.split(".") for key in TRAINER_ONLY):
            entry = schema["properties"][section]
            del entry["default"][field]
            del schema["$defs"][entry["$ref"].rpartition("/")[2]]["properties"][field]
        return schema

    def to_dict(self) -> dict[str, Any]:
        """Plain data without the `TRAINER_ONLY` settings (here always their defaults): a saved
        config.yaml holds only keys that rl's schema knows, so editors find nothing to flag."""
        tree = super().to_dict()
        for section, field in (key.split(".") for key in TRAINER_ONLY):
            del tree[section][field]
        return tree

    @model_validator(mode="after")
    def _read_by_the_algorithm(self) -> RLConfig:
        """Refuses a trainer setting that this algorithm would ignore."""
        for key in TRAINER_ONLY + (SFT_ONLY if self.algorithm != "sft" else ()):
            section, field = key.split(".")
            node = getattr(self, section)
            value, default = getattr(node, field), type(node).model_fields[field].default
            if value != default:
                users = "no algorithm" if key in TRAINER_ONLY else "only sft"
                raise ConfigError(
                    f"{key}={value!r} has no effect in jaxstack-rl {self.algorithm} ({users} "
                    f"reads it; it is a jaxstack-train setting): remove it, or set {default!r}"
                )
        return self

    @model_validator(mode="after")
    def _own_tokenizer(self) -> RLConfig:
        """Warns when `data.tokenizer` replaces the tokenizer that an `init.hf` folder brings."""
        own = pathlib.Path(self.init.hf or "") / "tokenizer.json"
        chosen = pathlib.Path(self.data.tokenizer).resolve()
        if self.init.hf and own.is_file() and chosen not in (own.resolve(), own.parent.resolve()):
            warnings.warn(
                f"data.tokenizer={self.data.tokenizer!r} replaces the tokenizer of "
                f"init.hf={self.init.hf!r}: the model's token ids then stand for other text; "
                "leave data.tokenizer unset to train with the model's own",
                stacklevel=2,
            )
        return self

    @model_validator(mode="after")
    def _rl_together(self) -> RLConfig:
        if self.init.checkpoint and self.init.hf:
            raise ConfigError("init.checkpoint and init.hf are both set; keep one")
        if self.lora.quantize and not self.lora.rank:
            raise ConfigError("lora.quantize (QLoRA) needs adapters: set lora.rank > 0")
        if self.lora.quantize and self.algorithm in ("grpo", "ppo"):
            raise ConfigError(
                f"lora.quantize (QLoRA) is for sft, dpo and orpo: {self.algorithm}'s rollout "
                "engine serves float weights (use lora.quantize=null)"
            )
        return self


def list_presets() -> list[str]:
    """Names of the YAML configs shipped with jaxstack-rl."""
    return trainer.list_configs(__package__)


def load_config(
    algorithm: str | None, name_or_path: str | None = None, overrides: Iterable[str] = ()
) -> RLConfig:
    """Reads a preset or YAML file (or starts empty), applies dotted overrides, validates.

    `algorithm` (from the CLI sub-command) wins over the file's `algorithm` key. Next to
    `init.hf`, an override of a `model.*` field outside `HF_COMPUTE_FIELDS` is an error: the
    folder defines the model (a preset's own model section is simply not used).
    """
    overrides = list(overrides)
    try:
        tree = trainer.read_config_tree(name_or_path, __package__)[0] if name_or_path else {}
        tree = trainer.apply_overrides(tree, overrides)
        keys = [trainer.parse_override(item)[0] for item in overrides]
    except trainer.ConfigError as e:
        raise ConfigError(str(e)) from None
    config = RLConfig.from_dict(tree, algorithm)
    ignored = [k for k in keys if k.startswith("model.") and k[6:] not in HF_COMPUTE_FIELDS]
    if config.init.hf and ignored:
        raise ConfigError(
            f"{ignored[0]} has no effect next to init.hf={config.init.hf!r}: the folder's "
            "config.json defines the model, and of the model section only "
            f"{', '.join(HF_COMPUTE_FIELDS)} apply to it; remove the override"
        )
    return config
