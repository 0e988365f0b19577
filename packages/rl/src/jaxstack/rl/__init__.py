"""Post-training: SFT, LoRA/QLoRA, DPO, GRPO/PPO."""

__all__: list[str] = []
