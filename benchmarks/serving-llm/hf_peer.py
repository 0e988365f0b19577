"""The peer: Hugging Face transformers `generate` (torch, CPU) on the same weights and requests.

Run by run.py with the torch venv's Python:
`python hf_peer.py MODEL_DIR REQUESTS.json OUT.json BATCH_SIZES ROUNDS`.
Greedy decoding, each request generating exactly its output length. Two modes:
- one at a time: each request alone; TTFT is a `max_new_tokens=1` call on its prompt;
- static batches (ROUNDS batches of each size in BATCH_SIZES, e.g. "8,32"): requests in arrival
  order, left-padded to the longest prompt, decoding until the longest output of the batch;
  output tokens/s counts only the tokens asked for.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    model_dir, requests_path, out_path, batch_sizes, rounds = sys.argv[1:6]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    requests = json.loads(pathlib.Path(requests_path).read_text())
    pad = 0
    out = {"torch": torch.__version__, "threads": torch.get_num_threads()}

    def generate(ids: list[list[int]], new: int) -> torch.Tensor:
        width = max(len(i) for i in ids)
        tokens = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        with torch.inference_mode():
            return model.generate(
                input_ids=tokens,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=pad,
            )

    generate([requests[0]["prompt"]], 4)  # warm-up
    single = requests[: max(4, len(requests) // 8)]
    e2e, ttft, tokens = [], [], 0
    for r in single:
        t0 = time.perf_counter()
        generate([r["prompt"]], 1)
        ttft.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        generate([r["prompt"]], r["output_len"])
        e2e.append(time.perf_counter() - t0)
        tokens += r["output_len"]
    elapsed = sum(e2e)
    out["one_at_a_time"] = {
        "requests": len(single),
        "output_tokens_per_s": tokens / elapsed,
        "requests_per_s": len(single) / elapsed,
        "e2e_p50_s": statistics.median(e2e),
        "ttft_p50_s": statistics.median(ttft),
        "tpot_p50_s": statistics.median(
            (e - t) / (r["output_len"] - 1) for e, t, r in zip(e2e, ttft, single, strict=True)
        ),
    }
    out["static_batch"] = []
    for b in (int(x) for x in batch_sizes.split(",")):
        batch_reqs = requests[: int(rounds) * b]
        t0 = time.perf_counter()
        for i in range(0, len(batch_reqs), b):
            chunk = batch_reqs[i : i + b]
            generate([r["prompt"] for r in chunk], max(r["output_len"] for r in chunk))
        elapsed = time.perf_counter() - t0
        useful = sum(r["output_len"] for r in batch_reqs)
        out["static_batch"].append(
            {
                "batch_size": b,
                "requests": len(batch_reqs),
                "output_tokens_per_s": useful / elapsed,
                "requests_per_s": len(batch_reqs) / elapsed,
            }
        )
    pathlib.Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
