"""TRL's side of benchmarks/rl/vs_trl.py: DPO/SFT/GRPOTrainer on the same folder and data.

Runs in a Python with torch, transformers and TRL (not jaxstack): `python trl_side.py SPEC.json`
with SPEC's `algorithm` (dpo, sft or grpo; grpo also reads `group_size`, `max_new_tokens`
and `kl_coef`), `model` (an HF folder), `data` (JSONL), `steps`,
`batch_size`, `max_length`, `learning_rate`, `beta` and `out`. Settings are aligned with
jaxstack's (fp32, constant learning rate, no clipping, no gradient checkpointing, no packing);
prints `RESULT {json}` with each step's wall time and loss.
"""

import json
import sys
import time

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

with open(sys.argv[1]) as f:
    spec = json.load(f)
torch.manual_seed(0)
torch.set_num_threads(int(spec.get("threads", 2)))


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self.losses, self.completion_lengths, self._t = [], [], [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if logs and "completions/mean_length" in logs:  # GRPO
            self.completion_lengths.append(float(logs["completions/mean_length"]))


common = dict(
    output_dir=spec["out"],
    per_device_train_batch_size=spec["batch_size"],
    max_steps=spec["steps"],
    learning_rate=spec["learning_rate"],
    lr_scheduler_type="constant",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=0.0,
    bf16=False,
    fp16=False,
    gradient_checkpointing=False,
    logging_steps=1,
    report_to=[],
    save_strategy="no",
    dataloader_num_workers=0,
    seed=0,
    use_cpu=True,
    max_length=spec["max_length"],
)
tokenizer = AutoTokenizer.from_pretrained(spec["model"])
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
data = load_dataset("json", data_files=spec["data"], split="train")
timer = StepTimes()
if spec["algorithm"] == "dpo":
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(**common, beta=spec["beta"], loss_type=["sigmoid"])
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
elif spec["algorithm"] == "grpo":
    from trl import GRPOConfig, GRPOTrainer

    def _answer(prompt):
        a, b = prompt.strip().rstrip("=").split("+")
        return str(int(a) + int(b))

    def exact_answer(prompts, completions, **kwargs):
        return [float(c.strip() == _answer(p)) for p, c in zip(prompts, completions, strict=True)]

    def digit_credit(prompts, completions, **kwargs):
        out = []
        for p, c in zip(prompts, completions, strict=True):
            got, want = c.strip(), _answer(p)
            if not got.isdigit():
                out.append(0.0)
                continue
            width = max(len(got), len(want))
            out.append(
                sum(g == w for g, w in zip(got.rjust(width), want.rjust(width), strict=True))
                / width
            )
        return out

    common.pop("max_length")
    common["per_device_train_batch_size"] = spec["batch_size"] * spec["group_size"]
    args = GRPOConfig(
        **common,
        num_generations=spec["group_size"],
        max_completion_length=spec["max_new_tokens"],
        beta=spec["kl_coef"],
        loss_type="grpo",
        temperature=1.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[exact_answer, digit_credit],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
    )
else:
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(**common, packing=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
trainer.add_callback(timer)
trainer.train()
import transformers  # noqa: E402
import trl  # noqa: E402

versions = {"torch": torch.__version__, "transformers": transformers.__version__}
versions["trl"] = trl.__version__
result = {
    "step_times_s": timer.times,
    "losses": timer.losses,
    "completion_lengths": timer.completion_lengths,
    "versions": versions,
}
print("RESULT " + json.dumps(result))
