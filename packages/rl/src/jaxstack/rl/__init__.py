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

from jaxstack.rl._src import arithmetic
from jaxstack.rl._src.cli import main
from jaxstack.rl._src.config import (
    ALGORITHMS,
    DpoSection,
    GrpoSection,
    InitSection,
    LoraSection,
    OrpoSection,
    PpoSection,
    RLConfig,
    RolePlacement,
    RolesSection,
    RolloutSection,
    SftSection,
    list_presets,
    load_config,
)
from jaxstack.rl._src.encode import DEFAULT_CHAT_TEMPLATE
from jaxstack.rl._src.errors import ConfigError, Error, RecordError, RewardError
from jaxstack.rl._src.logprobs import sequence_logprobs, token_logprobs
from jaxstack.rl._src.losses import dpo_loss, gae, group_advantages, grpo_loss, orpo_loss, ppo_loss
from jaxstack.rl._src.online import grpo, ppo
from jaxstack.rl._src.preference import dpo, orpo
from jaxstack.rl._src.recipe import run_arithmetic
from jaxstack.rl._src.records import (
    PreferenceRecord,
    SftRecord,
    read_preference_records,
    read_prompts,
    read_sft_records,
)
from jaxstack.rl._src.rewards import Reward
from jaxstack.rl._src.run import RunResult
from jaxstack.rl._src.sft import sft

__all__ = [
    "ALGORITHMS",
    "DEFAULT_CHAT_TEMPLATE",
    "ConfigError",
    "DpoSection",
    "Error",
    "GrpoSection",
    "InitSection",
    "LoraSection",
    "OrpoSection",
    "PpoSection",
    "PreferenceRecord",
    "RLConfig",
    "RecordError",
    "Reward",
    "RewardError",
    "RolePlacement",
    "RolesSection",
    "RolloutSection",
    "RunResult",
    "SftRecord",
    "SftSection",
    "arithmetic",
    "dpo",
    "dpo_loss",
    "gae",
    "group_advantages",
    "grpo",
    "grpo_loss",
    "list_presets",
    "load_config",
    "main",
    "orpo",
    "orpo_loss",
    "ppo",
    "ppo_loss",
    "read_preference_records",
    "read_prompts",
    "read_sft_records",
    "run_arithmetic",
    "sequence_logprobs",
    "sft",
    "token_logprobs",
]
