"""GRPO's train step and reference forward: every position's logits, the completions', packed.

    nice -n 19 .venv/bin/python benchmarks/rl/grpo_logprobs_ab.py [--vocab 259] [--model tiny]
        [--max-new-tokens 4] [--prompts 16] [--calls 60]

A same-process A/B/C (the variants called in turn, medians over the calls after the first 5):
`token_logprobs` (logits at every position, as rl 0.7.1's GRPO), `completion_logprobs` (at the
loss mask's positions only, rl 0.8.0's), the same on the rows packed several to a row (rl
0.9.0's update, `pack_rows`) and on each group's prompt packed once with its completions after
it (rl 0.10.0's, `pack_groups` and `shared_prompt_attention`), on `tiny-grpo`'s model freshly
initialised (`--model d256`: vs_trl.py's larger one; `arithmetic`: the arithmetic recipe's)
with a `--vocab`-token vocabulary, over `--prompts` x 8 rows shaped like vs_trl.py's `grpo`
case: each prompt 5-12 random tokens, in its 8 rows, completions of 1 to `--max-new-tokens`
(geometric lengths above 4), in 16 columns (32 when a row needs them, as GRPO trims its rows);
AdamW, GRPO's loss with KL. Prints the medians, the ratios to every position's and the load
average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

TINY_GRPO = {"d_model": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 4, "head_dim": 16}
TINY_GRPO["mlp_dim"] = 192  # the tiny-grpo preset's model
MODELS = {  # as vs_trl.py's MODELS
    "tiny": {},
    "d256": {"d_model": 256, "num_layers": 4, "head_dim": 64, "mlp_dim": 768},
    "arithmetic": {"d_model": 128, "num_layers": 3, "head_dim": 32, "mlp_dim": 384},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=259, help="vocabulary size (byte tokenizer: 259)")
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--max-new-tokens", type=int, default=4, help="longest completion")
    p.add_argument("--prompts", type=int, default=16, help="prompts (8 completions each)")
    p.add_argument("--calls", type=int, default=60, help="calls of each variant (> 5)")
    args = p.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from jaxstack import nnlib, rl
    from jaxstack.trainer import make_train_step

    longest = args.max_new_tokens
    fields = dict(TINY_GRPO, **MODELS[args.model], vocab_size=args.vocab, max_seq_len=128)
    model = nnlib.Transformer(nnlib.get_preset("tiny-llama").replace(**fields), rngs=nnx.Rngs(0))
    apply, params = nnlib.as_function(model)
    model.attention_fn = rl.shared_prompt_attention
    shared_apply = nnlib.as_function(model)[0]
    rng = np.random.default_rng(0)
    rows = 8 * args.prompts
    prompt_lengths = rng.integers(5, 13, args.prompts)
    prompts = np.repeat(prompt_lengths, 8)
    completions = np.minimum(
        rng.integers(1, 5, rows) if longest <= 4 else rng.geometric(0.3, rows), longest
    )
    columns = 16 if (prompts + completions).max() <= 17 else 32  # as GRPO trims its rows
    ends = prompts + completions - 1  # positions that predict a next token
    column = np.arange(columns)[None, :]
    real = column < ends[:, None]
    loss_mask = (real & (column >= prompts[:, None] - 1)).astype(np.float32)
    tokens = rng.integers(3, 259, (rows, columns))
    in_prompt = column < prompts[:, None]
    tokens = np.where(in_prompt, np.repeat(tokens[::8], 8, axis=0), tokens)  # a group's prompt
    host = {
        "tokens": np.where(real, tokens, 0).astype(np.int32),
        "targets": np.where(real, rng.integers(3, 259, (rows, columns)), 0).astype(np.int32),
        "segment_ids": real.astype(np.int32),
        "positions": np.where(real, column, 0).astype(np.int32),
        "loss_mask": loss_mask,
    }
    extra = {
        "advantages": rng.normal(size=rows).astype(np.float32),
        "ref_logps": np.zeros((rows, columns), np.float32),
    }
    batch = {**host, **extra, "completion_index": rl.completion_positions(loss_mask)}
    packed = {**rl.pack_rows(host), **extra}
    grouped = {**rl.pack_groups(host, prompt_lengths, 8), **extra}
    tx = optax.adamw(1e-3, weight_decay=0.0)
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    def loss(logprobs, apply):
        def loss_fn(params, batch):
            logps = logprobs(apply, params, batch)
            return rl.grpo_loss(
                logps,
                jax.lax.stop_gradient(logps),
                batch["ref_logps"],
                batch["advantages"],
                batch["loss_mask"],
                clip_eps=0.2,
                kl_coef=0.04,
            )

        return loss_fn

    variants = {
        "all": (rl.token_logprobs, apply, batch),
        "completions": (rl.completion_logprobs, apply, batch),
        "packed": (rl.completion_logprobs, apply, packed),
        "groups": (rl.completion_logprobs, shared_apply, grouped),
    }
    calls = {}
    for name, (logprobs, fn, data) in variants.items():
        data = jax.tree.map(jnp.asarray, data)
        step = jax.jit(make_train_step(loss(logprobs, fn), tx))
        calls[f"reference forward, {name}"] = (jax.jit(partial(logprobs, fn)), params, data)
        calls[f"train step, {name}"] = (step, state, data)
    times = {name: [] for name in calls}
    for _ in range(args.calls):
        for name, (fn, first, data) in calls.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(first, data))
            times[name].append(time.perf_counter() - t)
    ms = {name: statistics.median(t[5:]) * 1e3 for name, t in times.items()}
    print(
        f"model {args.model}, vocab {args.vocab}, rows {rows}x{columns} "
        f"(packed {'x'.join(map(str, packed['packed_tokens'].shape))}, "
        f"groups {'x'.join(map(str, grouped['packed_tokens'].shape))}), "
        f"{int(loss_mask.sum())} completion tokens "
        f"({batch['completion_index'].size} positions), load {os.getloadavg()[0]:.2f}"
    )
    for part in ("train step", "reference forward"):
        full = ms[f"{part}, all"]
        print(f"  {part}: all positions {full:.2f} ms", end="")
        for name in ("completions", "packed", "groups"):
            print(
                f", {name} {ms[f'{part}, {name}']:.2f} ms ({full / ms[f'{part}, {name}']:.2f}x)",
                end="",
            )
        print()


if __name__ == "__main__":
    main()
