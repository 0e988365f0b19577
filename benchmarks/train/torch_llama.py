"""PyTorch peers for benchmarks/train: a minimal Llama trainer and HF LlamaForCausalLM.

Same model dims, batch, fp32 and AdamW as jaxstack-train's run; random tokens (data loading is
not what is compared). Prints one JSON line with the median tokens/s after warm-up steps.

    python torch_llama.py --impl minimal --d-model 256 --layers 4 --heads 4 --mlp 1024 \
        --vocab 4096 --seq 256 --batch 8 --steps 30
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(nn.Module):
    def __init__(self, d, heads, head_dim, mlp):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * mlp, bias=False)
        self.down = nn.Linear(mlp, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        g, u = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, vocab, d, layers, heads, head_dim, mlp, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, head_dim, mlp) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        ang = torch.arange(seq).float()[:, None] * inv[None]
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.head(self.norm(x))


def build(args):
    if args.impl == "minimal":
        return Llama(
            args.vocab, args.d_model, args.layers, args.heads, args.head_dim, args.mlp, args.seq
        )
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=args.mlp,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.seq,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["minimal", "hf"], default="minimal")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mlp", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after the timed steps, run this many more under torch.profiler and add each "
        "op's self CPU time per step to the output (`ops_ms_per_step`)",
    )
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = build(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1))

    def train_step() -> float:
        out = model(tokens[:, :-1])
        logits = out if isinstance(out, torch.Tensor) else out.logits
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    times, losses = [], []
    for step in range(args.steps + args.warmup):
        t = time.perf_counter()
        losses.append(train_step())
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    result = {
        "impl": args.impl,
        "median_step_s": step_s,
        "tokens_per_sec": args.batch * args.seq / step_s,
        "final_loss": losses[-1],
        "finite": all(math.isfinite(x) for x in losses),
    }
    if args.profile_steps:
        t = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.profile_steps):
                train_step()
        result["profiled_step_s"] = (time.perf_counter() - t) / args.profile_steps
        result["ops_ms_per_step"] = {
            e.key: e.self_cpu_time_total / 1e3 / args.profile_steps
            for e in prof.key_averages()
            if e.self_cpu_time_total > 0
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
