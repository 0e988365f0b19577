"""Trains the `test` preset under several mesh layouts in this process; prints JSON losses.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=N for N CPU devices. argv[1]: run
directory root; argv[2:]: layouts as "data=2,fsdp=4" (axes not named are 1).
"""

import json
import sys

from jaxstack.trainer import load_config, train

root, layouts = sys.argv[1], sys.argv[2:]
out = {}
for layout in layouts:
    axes = dict.fromkeys(("data", "fsdp", "tensor", "expert"), 1)
    for part in layout.split(","):
        k, v = part.split("=")
        axes[k] = int(v)
    overrides = [f"mesh.{k}={v}" for k, v in axes.items()] + [
        f"log.run_dir={root}/{layout.replace(',', '_').replace('=', '')}",
        "train.steps=6",
        "checkpoint.enabled=false",
        "eval.every=0",
        "log.sample_tokens=0",
        "model.num_heads=4",
        "model.num_kv_heads=2",
        "model.head_dim=8",
    ]
    result = train(load_config("test", overrides))
    from jaxstack.trainer import read_jsonl

    records = read_jsonl(result.run_dir / "metrics.jsonl")
    out[layout] = {
        "loss": [r["loss"] for r in records if r["kind"] == "train"],
        "grad_norm": [r["grad_norm"] for r in records if r["kind"] == "train"],
        "eval_loss": result.eval["eval_loss"],
    }
print("RESULT " + json.dumps(out))
