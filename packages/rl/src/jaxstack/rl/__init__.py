"""jaxstack.rl: post-training of nnlib models — SFT, LoRA, DPO, ORPO, GRPO and PPO.

    from jaxstack import rl

    config = rl.load_config("sft", "my.yaml", ["train.steps=200", "lora.rank=8"])
    rl.sft(config)                                   # run_dir/model: the fine-tuned model
    rl.grpo(rl.load_config("grpo", "rl.yaml"), rewards=[(my_reward, 1.0)])

Runs use the trainer's config style, logging and reports, ckptlib checkpoints (resumable
mid-run), datalib chat templates and packing, and the serving engine for rollouts with weights
handed over in memory; GRPO's and PPO's actor, reference and rollout engine each on the device
mesh `roles.<role>` names. The objectives are pure functions (`dpo_loss`, `orpo_loss`,
`grpo_loss`, `group_advantages`, `gae`, `ppo_loss`). See docs/rl.md.
"""

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.rl, or a command's --help, does not import JAX.
_EXPORTS = {
    "arithmetic": "arithmetic",
    "main": "cli",
    "ALGORITHMS": "config",
    "DpoSection": "config",
    "GrpoSection": "config",
    "InitSection": "config",
    "LoraSection": "config",
    "OrpoSection": "config",
    "PpoSection": "config",
    "RLConfig": "config",
    "RolePlacement": "config",
    "RolesSection": "config",
    "RolloutSection": "config",
    "SftSection": "config",
    "list_presets": "config",
    "load_config": "config",
    "DEFAULT_CHAT_TEMPLATE": "encode",
    "ConfigError": "errors",
    "Error": "errors",
    "RecordError": "errors",
    "RewardError": "errors",
    "sequence_logprobs": "logprobs",
    "token_logprobs": "logprobs",
    "dpo_loss": "losses",
    "gae": "losses",
    "group_advantages": "losses",
    "grpo_loss": "losses",
    "orpo_loss": "losses",
    "ppo_loss": "losses",
    "grpo": "online",
    "ppo": "online",
    "dpo": "preference",
    "orpo": "preference",
    "run_arithmetic": "recipe",
    "PreferenceRecord": "records",
    "SftRecord": "records",
    "read_preference_records": "records",
    "read_prompts": "records",
    "read_sft_records": "records",
    "Reward": "rewards",
    "RunResult": "run",
    "sft": "sft",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}._src.{_EXPORTS[name]}")
    value = module if name == "arithmetic" else getattr(module, name)  # a public module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
