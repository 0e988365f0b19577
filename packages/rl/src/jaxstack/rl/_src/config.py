"""Post-training run configuration: the trainer's sections plus one section per RL concern.

A config file is the trainer's YAML (`model`, `optim`, `data`, `mesh`, `train`, `eval`,
`checkpoint`, `log`, validated by `jaxstack.trainer.Config`) with these sections added, each a
dataclass below validated the trainer's way (unknown keys get the nearest valid one, wrong
types are refused):

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

import dataclasses
import importlib.resources
import os
import pathlib
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from jaxstack.rl._src.errors import ConfigError

ALGORITHMS = ("sft", "dpo", "orpo", "grpo", "ppo")
"""The post-training algorithms, one `jaxstack-rl` subcommand and config section each."""


@dataclasses.dataclass(frozen=True)
class InitSection:
    """Starting weights: `checkpoint` (a jaxstack-train or jaxstack-rl run directory, or its
    `checkpoints` folder: the latest step's params) or `hf` (a Hugging Face model folder);
    neither = a freshly initialised model (seeded by train.seed)."""

    checkpoint: str | None = None
    hf: str | None = None


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """The `lora:` section: LoRA adapters of `rank` (0: full fine-tuning) and `alpha` on the modules
    whose paths match `pattern`, with `dropout`; `quantize` stores the frozen base weights in a
    quantlib format (QLoRA: "nf4", "int4", "int8"; needs the `qlora` extra)."""

    rank: int = 0  # 0 = full fine-tuning
    alpha: float | None = None  # default: rank (scale 1)
    pattern: str = r"(attn/(q|k|v|o)_proj|mlp/(gate|up|down)_proj)$"
    dropout: float = 0.0
    # QLoRA: store the frozen base weights quantised (quantlib qtype, e.g. "nf4", "int4",
    # "int8"; the output head stays float); None = full-precision base. Needs the `qlora` extra.
    quantize: str | None = None
    quantize_tile: int = 64  # quantisation block size along the input features


@dataclasses.dataclass(frozen=True)
class SftSection:
    """The `sft:` section: the chat template (a tokenizer_config.json or its folder; None: the
    model's own or the built-in one) and which tokens the loss covers (`train_on`: "assistant"
    replies, or "all")."""

    chat_template: str | None = None  # tokenizer_config.json (or its folder); None = built-in
    train_on: str = "assistant"  # or "all"


@dataclasses.dataclass(frozen=True)
class DpoSection:
    """The `dpo:` section: `beta` (the KL strength), cDPO's `label_smoothing` (the assumed
    label-noise rate) and how the frozen reference's log-probs are had (`reference`:
    "precompute" once before training, or "live" each step)."""

    beta: float = 0.1
    label_smoothing: float = 0.0  # cDPO's assumed label-noise rate
    reference: str = "precompute"  # log-probs of the frozen reference: "precompute" or "live"


@dataclasses.dataclass(frozen=True)
class OrpoSection:
    """The `orpo:` section: `beta`, the weight of the odds-ratio term (the paper's lambda)."""

    beta: float = 0.1  # the paper's lambda


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """The `rollout:` section of GRPO and PPO: completions sampled per prompt (`group_size`), their
    length, temperature and top-k, and what a reward function that raises does (`on_reward_error`:
    "stop" the run or "skip" the completion)."""

    group_size: int = 8  # completions sampled per prompt
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int | None = None
    on_reward_error: str = "stop"  # "stop" the run, or "skip" the completion (no gradient)


@dataclasses.dataclass(frozen=True)
class GrpoSection:
    """The `grpo:` section: the clipping range, the KL coefficient, optimiser updates per batch of
    rollouts, the loss normalisation (`loss_type` "grpo" or "dr_grpo") and whether advantages are
    divided by the group's standard deviation."""

    clip_eps: float = 0.2
    kl_coef: float = 0.04
    updates_per_iteration: int = 1  # optimiser steps on each batch of rollouts (mu)
    # "grpo": token mean per completion; "dr_grpo": token sum over completions x max_new_tokens
    loss_type: str = "grpo"
    scale_rewards: bool = True  # divide advantages by the group's std (False: Dr. GRPO)


@dataclasses.dataclass(frozen=True)
class PpoSection:
    """The `ppo:` section: policy and value clipping, the value-loss weight, the per-token KL
    penalty folded into the rewards, GAE's `gamma` and `lam`, and optimiser updates per batch of
    rollouts."""

    clip_eps: float = 0.2
    value_clip_eps: float = 0.2
    value_coef: float = 0.1
    kl_coef: float = 0.05  # per-token KL penalty folded into the rewards
    gamma: float = 1.0
    lam: float = 0.95
    updates_per_iteration: int = 2


@dataclasses.dataclass(frozen=True)
class RolePlacement:
    """Where one role's arrays live: `devices` (indices into `jax.devices()`; None = all of
    them) and `mesh` (the trainer's mesh axes data/fsdp/tensor/expert and `rules` over those
    devices; None = the run's `mesh` section)."""

    devices: list[int] | None = None
    mesh: Any = None  # jaxstack.trainer.MeshConfig


@dataclasses.dataclass(frozen=True)
class RolesSection:
    """GRPO's and PPO's roles: the actor (trained params, optimiser state, update step), the
    reference (frozen starting params, its log-probs) and the rollout engine. PPO's critic is
    a value head on the actor's trunk, so it lives with the actor. Default: every role on the
    run's `mesh` over all devices."""

    actor: RolePlacement = RolePlacement()
    reference: RolePlacement = RolePlacement()
    rollout: RolePlacement = RolePlacement()


SECTIONS: dict[str, type] = {
    "init": InitSection,
    "lora": LoraSection,
    "sft": SftSection,
    "dpo": DpoSection,
    "orpo": OrpoSection,
    "rollout": RolloutSection,
    "grpo": GrpoSection,
    "ppo": PpoSection,
}


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """A validated post-training config: `base` is the trainer's part, the rest is ours."""

    algorithm: str
    base: Any  # jaxstack.trainer.Config
    init: InitSection = InitSection()
    lora: LoraSection = LoraSection()
    sft: SftSection = SftSection()
    dpo: DpoSection = DpoSection()
    orpo: OrpoSection = OrpoSection()
    rollout: RolloutSection = RolloutSection()
    grpo: GrpoSection = GrpoSection()
    ppo: PpoSection = PpoSection()
    roles: RolesSection = RolesSection()
    rewards: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {"algorithm": self.algorithm, **self.base.to_dict()}
        for section in SECTIONS:
            out[section] = dataclasses.asdict(getattr(self, section))
        out["roles"] = dataclasses.asdict(self.roles)
        out["rewards"] = dict(self.rewards)
        return out

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any], algorithm: str | None = None) -> RLConfig:
        from jaxstack import trainer

        try:
            return cls._from_dict(tree, algorithm)
        except trainer.ConfigError as e:  # the trainer's sections, in our error family
            raise ConfigError(str(e)) from None

    @classmethod
    def _from_dict(cls, tree: Mapping[str, Any], algorithm: str | None) -> RLConfig:
        from jaxstack.trainer import Config, build_section

        tree = dict(tree)
        algorithm = algorithm or tree.get("algorithm")
        tree.pop("algorithm", None)
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm={algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        ours = {s: build_section(s, c, tree.pop(s, None) or {}) for s, c in SECTIONS.items()}
        if ours["init"].hf and "tokenizer" not in (tree.get("data") or {}):
            # The model's own tokenizer: its ids are the ones the weights were trained on.
            tree["data"] = {**(tree.get("data") or {}), "tokenizer": ours["init"].hf}
        roles = _build_roles(tree.pop("roles", None) or {})
        rewards = tree.pop("rewards", None) or {}
        if not isinstance(rewards, Mapping) or not all(
            isinstance(w, int | float) and not isinstance(w, bool) for w in rewards.values()
        ):
            raise ConfigError(
                f"rewards must map 'module:function' to a numeric weight, got {rewards!r}"
            )
        tree = _short_run_warmup(tree)
        config = cls(
            algorithm=algorithm,
            base=Config.from_dict(tree, name=str(tree.get("name", algorithm))),
            roles=roles,
            rewards={str(k): float(v) for k, v in rewards.items()},
            **ours,
        )
        _check_values(config)
        return config

    def save(self, path: str | pathlib.Path) -> None:
        """Writes the resolved config as YAML (atomically), to repeat a run with `--config`."""
        write_atomic(pathlib.Path(path), yaml.safe_dump(self.to_dict(), sort_keys=False))


def _short_run_warmup(tree: dict[str, Any]) -> dict[str, Any]:
    """`optim.schedule.warmup_ratio` (TRL's name: warmup as a share of the run) becomes
    `warmup_steps` (replacing any given); a warmup as long as the run or longer (a preset's
    warmup in a short run) is clamped to a tenth of the run, with a warning, not refused."""
    from jaxstack.trainer import TrainSection

    optim = tree.get("optim")
    schedule = optim.get("schedule") if isinstance(optim, Mapping) else None
    if not isinstance(schedule, Mapping):
        return tree
    schedule = dict(schedule)
    train = tree.get("train") if isinstance(tree.get("train"), Mapping) else {}
    steps = schedule.get("total_steps") or train.get("steps", TrainSection.steps)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        return tree  # the trainer names the bad value
    if "warmup_ratio" in schedule:
        ratio = schedule.pop("warmup_ratio")
        if not isinstance(ratio, int | float) or isinstance(ratio, bool) or not 0 <= ratio < 1:
            raise ConfigError(
                f"optim.schedule.warmup_ratio={ratio!r}: give the warmup's share of the run, "
                "in [0, 1) (e.g. 0.1)"
            )
        schedule["warmup_steps"] = int(ratio * steps)  # replaces a preset's warmup_steps
    warmup = schedule.get("warmup_steps", 0)
    decays = schedule.get("name") not in (None, "constant", "warmup_constant")
    too_long = warmup >= steps if decays else warmup > steps  # as the trainer and optlib refuse
    if isinstance(warmup, int) and not isinstance(warmup, bool) and too_long:
        clamped = steps // 10
        warnings.warn(
            f"optim.schedule.warmup_steps={warmup} is not shorter than the {steps}-step run; "
            f"using {clamped} (a tenth of it). Set optim.schedule.warmup_ratio (a share of the "
            "run) or warmup_steps to choose.",
            UserWarning,
            stacklevel=4,
        )
        schedule["warmup_steps"] = clamped
    return {**tree, "optim": {**optim, "schedule": schedule}}


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Writes `text` under a unique temporary name beside `path`, then renames it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def list_presets() -> list[str]:
    """Names of the YAML configs shipped with jaxstack-rl."""
    root = importlib.resources.files("jaxstack.rl._src") / "presets"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_config(
    algorithm: str | None, name_or_path: str | None = None, overrides: Iterable[str] = ()
) -> RLConfig:
    """Reads a preset or YAML file (or starts empty), applies dotted overrides, validates.

    `algorithm` (from the CLI sub-command) wins over the file's `algorithm` key.
    """
    from jaxstack.trainer import apply_overrides

    tree = _read(name_or_path) if name_or_path else {}
    try:
        tree = apply_overrides(tree, overrides)
    except Exception as e:
        raise ConfigError(str(e)) from None
    return RLConfig.from_dict(tree, algorithm)


def _read(name_or_path: str) -> dict[str, Any]:
    path = pathlib.Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        text = path.read_text()
    elif name_or_path in list_presets():
        root = importlib.resources.files("jaxstack.rl._src") / "presets"
        tree = _parse(name_or_path, (root / f"{name_or_path}.yaml").read_text())
        data = tree.get("data")
        if isinstance(data, dict) and isinstance(data.get("path"), str):
            # a preset's own records (presets/data/) live beside it
            data["path"] = str(pathlib.Path(str(root)) / data["path"])
        return tree
    else:
        raise ConfigError(
            f"--config {name_or_path!r} is neither a YAML file nor a preset; presets: "
            f"{', '.join(list_presets())}"
        )
    return _parse(name_or_path, text)


def _parse(name_or_path: str, text: str) -> dict[str, Any]:
    try:
        tree = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{name_or_path}: not valid YAML ({e})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{name_or_path}: the top level must be a mapping of sections")
    return tree


def _build_roles(values: Mapping[str, Any]) -> RolesSection:
    """The `roles` section: each role's `devices` (distinct indices) and `mesh` (checked as the
    trainer checks its own `mesh` section). Whether they fit this host is checked at run start."""
    from jaxstack import trainer

    try:
        return _check_roles(values)
    except trainer.ConfigError as e:  # unknown or mistyped keys, in our error family
        raise ConfigError(str(e)) from None


def _check_roles(values: Mapping[str, Any]) -> RolesSection:
    from jaxstack.trainer import MeshConfig, build_section

    roles = build_section("roles", RolesSection, values)
    placed = {}
    for role in ("actor", "reference", "rollout"):
        key = f"roles.{role}"
        given = getattr(roles, role)
        if isinstance(given, RolePlacement):
            placed[role] = given
            continue
        placement = build_section(key, RolePlacement, given or {})
        devices = placement.devices
        if devices is not None:
            if not isinstance(devices, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices
            ):
                raise ConfigError(
                    f"{key}.devices={devices!r}: give a list of device indices, e.g. [0, 1]"
                )
            if not devices:
                raise ConfigError(f"{key}.devices=[]: give at least one device index (or null)")
            if len(set(devices)) != len(devices):
                raise ConfigError(f"{key}.devices={devices!r}: the indices must be distinct")
        mesh = placement.mesh
        if mesh is not None:
            mesh = build_section(f"{key}.mesh", MeshConfig, mesh)
        placed[role] = RolePlacement(devices, mesh)
    return RolesSection(**placed)


def _check_values(config: RLConfig) -> None:
    choices = {
        "sft.train_on": (config.sft.train_on, ("assistant", "all")),
        "dpo.reference": (config.dpo.reference, ("precompute", "live")),
        "rollout.on_reward_error": (config.rollout.on_reward_error, ("stop", "skip")),
        "grpo.loss_type": (config.grpo.loss_type, ("grpo", "dr_grpo")),
    }
    for key, (value, valid) in choices.items():
        if value not in valid:
            raise ConfigError(f"{key}={value!r}; use one of {', '.join(valid)}")
    positive = {
        "lora.rank": (config.lora.rank, 0),
        "rollout.group_size": (config.rollout.group_size, 2),
        "rollout.max_new_tokens": (config.rollout.max_new_tokens, 1),
        "grpo.updates_per_iteration": (config.grpo.updates_per_iteration, 1),
        "ppo.updates_per_iteration": (config.ppo.updates_per_iteration, 1),
    }
    for key, (value, low) in positive.items():
        if value < low:
            raise ConfigError(f"{key} must be >= {low}, got {value}")
    if config.rollout.top_k is not None and config.rollout.top_k < 1:
        raise ConfigError(f"rollout.top_k must be >= 1 or null, got {config.rollout.top_k}")
    if config.lora.quantize_tile < 1:
        raise ConfigError(f"lora.quantize_tile must be >= 1, got {config.lora.quantize_tile}")
    non_negative = {
        "dpo.beta": config.dpo.beta,
        "orpo.beta": config.orpo.beta,
        "grpo.clip_eps": config.grpo.clip_eps,
        "grpo.kl_coef": config.grpo.kl_coef,
        "ppo.clip_eps": config.ppo.clip_eps,
        "ppo.value_clip_eps": config.ppo.value_clip_eps,
        "ppo.kl_coef": config.ppo.kl_coef,
        "ppo.value_coef": config.ppo.value_coef,
    }
    for key, value in non_negative.items():
        if not value >= 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")
    unit = {"ppo.gamma": config.ppo.gamma, "ppo.lam": config.ppo.lam}
    for key, value in unit.items():
        if not 0 <= value <= 1:
            raise ConfigError(f"{key} must be in [0, 1], got {value}")
    if config.lora.alpha is not None and not config.lora.alpha > 0:
        raise ConfigError(f"lora.alpha must be > 0 (or null: the rank), got {config.lora.alpha}")
    if not 0 <= config.lora.dropout < 1:
        raise ConfigError(f"lora.dropout must be in [0, 1), got {config.lora.dropout}")
    if not config.rollout.temperature > 0:
        raise ConfigError(
            f"rollout.temperature must be > 0 (GRPO and PPO learn from sampled completions), "
            f"got {config.rollout.temperature}"
        )
    if not 0.0 <= config.dpo.label_smoothing < 0.5:
        raise ConfigError(
            f"dpo.label_smoothing must be in [0, 0.5), got {config.dpo.label_smoothing}"
        )
    if config.init.checkpoint and config.init.hf:
        raise ConfigError("init.checkpoint and init.hf are both set; keep one")
    if config.lora.quantize is not None:
        if config.lora.rank == 0:
            raise ConfigError("lora.quantize (QLoRA) needs adapters: set lora.rank > 0")
        if config.algorithm in ("grpo", "ppo"):
            raise ConfigError(
                f"lora.quantize (QLoRA) is for sft, dpo and orpo; {config.algorithm}'s rollout "
                "engine serves float weights, so use lora.quantize=null"
            )
