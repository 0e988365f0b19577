"""Each step shape compiles once per process: warm-up's programs are the ones serving runs.

In a fresh interpreter, because what the test guards against happens only there: a module
first loaded while the first step was being traced changed JAX's tracing context, so that
program's cache key was never matched again and its shape compiled a second time on the first
request (seconds of time to first token after a warm-up that was meant to prevent it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
from flax import nnx
from jaxstack import nnlib
from jaxstack.serving import LLM, SamplingParams
from jaxstack.serving._src.llm.model_runner import num_compilations

config = nnlib.ModelConfig(
    vocab_size=64, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
    mlp_dim=64, max_seq_len=64,
)
llm = LLM(nnlib.Transformer(config, rngs=nnx.Rngs(0)), max_num_seqs=4, max_num_batched_tokens=16)
llm.engine.runner.warmup()
warm = num_compilations()
prompts = [[1, 2, 3], list(range(5, 30)), [4, 5], [6]]  # 4 sequences, then 2, then 1
for extra in (
    {"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.5},
    {"temperature": 1.0, "logprobs": 2}, {"temperature": 1.0, "n": 3},
):
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True, **extra))
print(warm, num_compilations(), llm.engine.runner.num_programs)
"""


@pytest.mark.slow
def test_serving_after_warmup_compiles_nothing_in_a_fresh_process():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    warm, after, programs = map(int, done.stdout.split())
    # The model for 11 step shapes (2, 4, 8 and 16 tokens x 1, 2 and 4 sequences, no more
    # sequences than tokens), and sampling for each row bucket x greedy, sampling, sampling
    # with top-k/top-p x with and without log-probability alternatives, and the forks' block
    # copy per row bucket.
    assert (warm, after, programs) == (32, 32, 32)
