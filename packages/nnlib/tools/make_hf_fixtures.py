"""Write the HF-parity fixtures used by packages/nnlib/tests/test_hf_parity.py.

Runs in a separate torch venv (not the workspace), e.g.:

    python3.11 -m venv /tmp/nnlib-torchvenv
    /tmp/nnlib-torchvenv/bin/pip install torch==2.13.0 transformers safetensors numpy
    /tmp/nnlib-torchvenv/bin/python packages/nnlib/tools/make_hf_fixtures.py [FAMILY ...]

Named families (default: all) are rewritten; the others stay as they are.

For every family it builds a tiny randomly initialised HF transformers model (weights redrawn
with a large std so any mapping or formula error moves the logits far beyond the tolerance),
saves it with `save_pretrained` (config.json + model.safetensors; llama also as a sharded
checkpoint with index.json), and writes `io.safetensors` with input tokens and HF's float32
logits. Total size stays a few hundred KB.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
SMALL = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
MOE = dict(num_experts_per_tok=2)
QWEN3_MOE = dict(SMALL, num_experts=4, moe_intermediate_size=32, norm_topk_prob=True, **MOE)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
    "rope_theta": 500000.0,
}

FAMILIES = {
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(SMALL, rope_parameters=LLAMA3_ROPE),
    ),
    "mistral": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        dict(SMALL, sliding_window=4),
    ),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(SMALL)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(SMALL)),
    "gemma": (
        transformers.GemmaConfig,
        transformers.GemmaForCausalLM,
        dict(SMALL, tie_word_embeddings=True),
    ),
    "gemma2": (
        transformers.Gemma2Config,
        transformers.Gemma2ForCausalLM,
        dict(
            SMALL,
            tie_word_embeddings=True,
            sliding_window=4,
            query_pre_attn_scalar=6,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
    ),
    "mixtral": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        dict(SMALL, num_local_experts=4, **MOE),
    ),
    # Qwen's sliding-window rule: layers from max_window_layers on slide (qwen3); every layer
    # slides (qwen3_moe). Ten tokens over a window of 4 make the window change the logits.
    "qwen3-sliding": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    ),
    "qwen3_moe-sliding": (
        transformers.Qwen3MoeConfig,
        transformers.Qwen3MoeForCausalLM,
        dict(QWEN3_MOE, use_sliding_window=True, sliding_window=4),
    ),
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        transformers.Qwen3MoeForCausalLM,
        dict(QWEN3_MOE, decoder_sparse_step=1, mlp_only_layers=[]),
    ),
}


def main(names: list[str]) -> None:
    torch.manual_seed(0)
    tokens = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (2, 10)).astype(np.int64)
    for name in names:
        config_cls, model_cls, kw = FAMILIES[name]
        shutil.rmtree(OUT / name, ignore_errors=True)
        config = config_cls(**kw)
        config._attn_implementation = "eager"
        model = model_cls(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(
                    torch.randn_like(p) * 0.3
                    + (1.0 if p.ndim == 1 and "gemma" not in name else 0.0)
                )
            logits = model(torch.from_numpy(tokens)).logits.float().numpy()
        folder = OUT / name
        model.save_pretrained(folder, safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        save_file(
            {"tokens": tokens.astype(np.int32), "logits": logits}, str(folder / "io.safetensors")
        )
        if name == "llama":
            sharded = OUT / "llama-sharded"
            shutil.rmtree(sharded, ignore_errors=True)
            model.save_pretrained(sharded, safe_serialization=True, max_shard_size="8KB")
            (sharded / "generation_config.json").unlink(missing_ok=True)
        print(name, "max |logit|", float(np.abs(logits).max()))
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(
        f"wrote {OUT} ({total / 1024:.0f} KB), "
        f"transformers {transformers.__version__}, torch {torch.__version__}"
    )


if __name__ == "__main__":
    main(sys.argv[1:] or list(FAMILIES))
