"""Loads a jaxstack-rl run's folders with transformers and peft; prints `RESULT {json}`.

Run with a Python that has torch, transformers and peft (not jaxstack):
`python hf_peers_check.py SPEC.json`, where SPEC holds `model` (run_dir/model), `adapter`
(run_dir/adapter), `base` (the init.hf folder), `messages` (the prompt conversation),
and `max_new_tokens`; generation runs past every stop token, so that all `max_new_tokens`
are compared. The result holds the chat-template prompt ids, the greedy
completion ids of AutoModelForCausalLM, and the largest logit difference between the merged
model and the PEFT adapter loaded onto the base (and, for scale, the base alone).
"""

import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

with open(sys.argv[1]) as f:
    spec = json.load(f)
tokenizer = AutoTokenizer.from_pretrained(spec["model"])
prompt = tokenizer.apply_chat_template(spec["messages"], add_generation_prompt=True, tokenize=True)
if isinstance(prompt, dict) or hasattr(
    prompt, "input_ids"
):  # transformers 5 returns a BatchEncoding
    prompt = prompt["input_ids"]
prompt = [int(t) for t in prompt]
model = AutoModelForCausalLM.from_pretrained(spec["model"], torch_dtype=torch.float32).eval()
ids = torch.tensor([prompt])
model.generation_config.eos_token_id = None  # no early stop: compare every position
with torch.no_grad():
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=spec["max_new_tokens"],
        do_sample=False,
        pad_token_id=model.config.pad_token_id,
    )
    merged_logits = model(ids).logits
    base = AutoModelForCausalLM.from_pretrained(spec["base"], torch_dtype=torch.float32)
    base_logits = base(ids).logits
    peft_model = PeftModel.from_pretrained(base, spec["adapter"]).eval()
    peft_logits = peft_model(ids).logits
result = {
    "prompt_ids": prompt,
    "completion_ids": [int(t) for t in out[0, len(prompt) :]],
    "peft_max_logit_diff": float((merged_logits - peft_logits).abs().max()),
    "base_max_logit_diff": float((merged_logits - base_logits).abs().max()),
    "peft_lora_modules": sorted(
        {n.rsplit(".lora_", 1)[0] for n, _ in peft_model.named_parameters() if ".lora_A." in n}
    ),
}
print("RESULT " + json.dumps(result))
