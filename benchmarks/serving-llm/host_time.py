"""The engine's host time: how long the main thread works per round, and per model launch.

    PYTHONPATH=<sources> .venv/bin/python benchmarks/serving-llm/host_time.py [--rounds 400]
        [--json out.json]

A round is one batch driven to completion through `LLMEngine.step`, as `LLM.generate` and rl's
rollouts drive it: `grpo` is a GRPO round at benchmarks/rl's setting (16 prompts x 8 samples of
at most 4 tokens, temperature 1, the engine sized as rl sizes it), `c8` eight prompts of 128
tokens decoding 32 tokens each (`ignore_eos`), both on engine_ab.py's model (Llama d=256,
4 layers, vocabulary 8,000, float32, random weights). Per workload, after warm-up rounds:
the median round (wall clock), the main thread's CPU time per round (`time.thread_time`: the
engine's Python and the launches, not XLA's worker threads, so other processes' load moves it
less than the wall clock) and the median wall time of a call to the model program
(`model_runner._forward`: it returns before the step computes, so this is the launch alone).
Meant for A/Bs of the engine's host code: run it with the old and the new sources in turn
(`PYTHONPATH`), several times each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Iterator

import numpy as np
from flax import nnx

from jaxstack import nnlib
from jaxstack.serving import LLM, SamplingParams

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import measure_conditions
from engine_ab import MODEL

WORKLOADS = {  # prompts, prompt tokens, SamplingParams, engine options
    "grpo": (
        16,
        12,
        dict(n=8, max_tokens=4, temperature=1.0, detokenize=False),
        dict(max_model_len=16, max_num_seqs=128, max_num_batched_tokens=256),
    ),
    "c8": (
        8,
        128,
        dict(max_tokens=32, temperature=0.8, ignore_eos=True, detokenize=False),
        dict(max_num_seqs=32, max_num_batched_tokens=2048),
    ),
}


@contextlib.contextmanager
def launches_timed(engine) -> Iterator[list[float]]:
    """Within the block, the wall time of each call to the engine's model program (`_forward`
    of its runner's module, reached through the engine as engine_ab.py reaches it) is appended
    to the list yielded."""
    module = sys.modules[type(engine.runner).__module__]
    times, program = [], module._forward

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = program(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return out

    module._forward = timed
    try:
        yield times
    finally:
        module._forward = program


def measure(model: nnx.Module, workload: str, rounds: int) -> dict:
    num_prompts, length, params, options = WORKLOADS[workload]
    engine = LLM(model, **options).engine
    prompts = np.random.default_rng(0).integers(0, MODEL.vocab_size, (num_prompts, length)).tolist()
    sampling = SamplingParams(**params)

    def one_round() -> None:
        for prompt in prompts:
            engine.add_request(prompt, sampling)
        while engine.has_unfinished():
            engine.step()

    for _ in range(10):  # compiles
        one_round()
    with launches_timed(engine) as launches:
        walls, cpu = [], time.thread_time()
        for _ in range(rounds):
            start = time.perf_counter()
            one_round()
            walls.append(time.perf_counter() - start)
    return {
        "round_ms": statistics.median(walls) * 1e3,
        "main_thread_cpu_ms_per_round": (time.thread_time() - cpu) / rounds * 1e3,
        "launch_ms": statistics.median(launches) * 1e3,
        "launches_per_round": len(launches) / rounds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args()
    model = nnlib.Transformer(MODEL, rngs=nnx.Rngs(0))
    with measure_conditions(packages=["jax", "jaxlib", "flax", "jaxstack-serving"]) as conditions:
        results = {w: measure(model, w, args.rounds) for w in WORKLOADS}
    for workload, r in results.items():
        print(workload, " ".join(f"{k} {v:.3f}" for k, v in r.items()))
    if args.json:
        args.json.write_text(json.dumps({"results": results, **conditions.as_dict()}, indent=1))


if __name__ == "__main__":
    main()
