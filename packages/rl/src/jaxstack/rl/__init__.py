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

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.rl, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=["arithmetic"],
    submod_attrs={
        "_src.cli": ["main"],
        "_src.config": [
            "ALGORITHMS",
            "DpoSection",
            "GrpoSection",
            "InitSection",
            "LoraSection",
            "OrpoSection",
            "PpoSection",
            "RLConfig",
            "RolePlacement",
            "RolesSection",
            "RolloutSection",
            "SFT_ONLY",
            "SftSection",
            "TRAINER_ONLY",
            "list_presets",
            "load_config",
        ],
        "_src.encode": ["DEFAULT_CHAT_TEMPLATE", "pack_rows"],
        "_src.errors": ["ConfigError", "Error", "RecordError", "RewardError"],
        "_src.logprobs": [
            "completion_logprobs",
            "completion_positions",
            "sequence_logprobs",
            "token_logprobs",
        ],
        "_src.losses": [
            "dpo_loss",
            "gae",
            "group_advantages",
            "grpo_loss",
            "orpo_loss",
            "ppo_loss",
        ],
        "_src.online": ["grpo", "ppo"],
        "_src.preference": ["dpo", "orpo"],
        "_src.recipe": ["run_arithmetic"],
        "_src.records": [
            "PreferenceRecord",
            "SftRecord",
            "read_preference_records",
            "read_prompts",
            "read_sft_records",
        ],
        "_src.rewards": ["Reward"],
        "_src.run": ["RunResult"],
        "_src.sft": ["sft"],
        "_src.shared_prompt": ["pack_groups", "shared_prompt_attention"],
    },
)
