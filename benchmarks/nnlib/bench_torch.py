"""HF transformers side of bench.py (runs in the torch venv): LlamaForCausalLM fwd+bwd timing.

    python bench_torch.py '<nnlib ModelConfig JSON>' BATCH SEQ ITERS

Prints one JSON line with the median seconds of forward + cross-entropy + backward.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import transformers


def main():
    cfg, b, t, iters = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    config = transformers.LlamaConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["d_model"],
        intermediate_size=cfg["mlp_dim"],
        num_hidden_layers=cfg["num_layers"],
        num_attention_heads=cfg["num_heads"],
        num_key_value_heads=cfg["num_kv_heads"],
        head_dim=cfg["head_dim"],
        max_position_embeddings=cfg["max_seq_len"],
        rms_norm_eps=cfg["norm_eps"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).float().train()
    tokens = torch.randint(0, cfg["vocab_size"], (b, t))

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        return loss

    for _ in range(2):
        step()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "median_s": statistics.median(times),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
