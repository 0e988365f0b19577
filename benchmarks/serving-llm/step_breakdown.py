"""Where a decode step's time goes, float32 against weight-only int8 (issue 31, goals 2-3).

engine_ab's d=512 model (8 heads of 64, MLP 1,536, 4 layers, vocabulary 8,000; `--model d256`:
issue 31's d=256 one) as float32 and as quantlib's `int8` preset (per-channel int8 weights,
every Dense), each served by `LLM` with issue 31's settings. `--concurrency c` sequences of 128
prompt tokens decode together, at a context of about 128 + `--context`. Per variant, in
alternating rounds: `LLMEngine.step()` of the c sampled decodes (all host work included), and
the step's model program alone (`runner.lower(...)`, compiled, called on the captured inputs of
a real decode) until its logits are ready. Then 20 engine steps under xprof-lite's `trace`,
joined with the model program's HLO (`profile_from_trace`): the program's own op times by
category. The model program's wall time beyond its op times is XLA:CPU's runtime between ops;
the step's beyond the model program is sampling and host work not hidden behind the program.

    .venv/bin/python benchmarks/serving-llm/step_breakdown.py --rounds 5 --json out.json
    .venv/bin/python benchmarks/serving-llm/step_breakdown.py --model d256 --concurrency 32
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np
from engine_ab import D512, MODEL, SAMPLED, quantized
from flax import nnx

from jaxstack import nnlib, xprof_lite
from jaxstack.serving import LLM, SamplingParams

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import conditions_markdown, measure_conditions

OPTIONS = dict(max_model_len=2048, max_num_seqs=32, max_num_batched_tokens=2048)
MODELS = {"d512": D512, "d256": MODEL}
PACKAGES = ["jax", "jaxlib", "jaxstack-serving", "jaxstack-kernlib", "jaxstack-quantlib"]


class DecodeStep:
    """One variant: its LLM, a real decode's model-program inputs, and timers."""

    def __init__(self, model: nnx.Module, prompts: list[list[int]], context: int):
        self.llm, self.prompts = LLM(model, **OPTIONS), prompts
        runner, seen = self.llm.engine.runner, {}
        # the runner's module (benchmarks use no private imports), whose `_forward` a step calls
        module = sys.modules[type(runner).__module__]
        forward = module._forward

        c = len(prompts)

        def spy(leaves, k, v, x, previous, **static):
            if x.tokens.shape[0] == runner.bucket(c) and int(x.num_seqs) == c:
                seen["x"] = x  # a step in which every sequence decodes
            return forward(leaves, k, v, x, previous, **static)

        module._forward = spy
        self.llm.generate(prompts, SamplingParams(max_tokens=context, ignore_eos=True))
        module._forward = forward
        self.x = seen["x"]  # the last such step, at a context of about 128 + context
        self.program = runner.lower(c, num_seqs=c).compile()

    def model_ms(self, reps: int = 20) -> float:
        runner, times = self.llm.engine.runner, []
        for _ in range(reps):
            t0 = time.perf_counter()
            logits, _, runner.k, runner.v = self.program(
                runner.state_leaves, runner.k, runner.v, self.x, runner.no_previous_tokens
            )
            logits.block_until_ready()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    def step_ms(self, steps: int = 40) -> list[float]:
        """Engine steps in which every sequence decodes (the prefill's steps left out)."""
        engine, times = self.llm.engine, []
        params = SamplingParams(max_tokens=steps, ignore_eos=True, seed=1, **SAMPLED)
        for prompt in self.prompts:
            engine.add_request(prompt, params)
        prompt_tokens = sum(len(p) for p in self.prompts)
        for _ in range(-(-prompt_tokens // OPTIONS["max_num_batched_tokens"])):
            engine.step()  # the prefill
        while engine.has_unfinished():
            t0 = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    def op_ms(self) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as logdir:
            with xprof_lite.trace(logdir, perfetto=False) as capture:
                self.step_ms(20)
            profiles = xprof_lite.profile_from_trace(
                capture.profile_data(), [self.program.as_text()]
            )
        [prof] = [p for p in profiles if p.hlo_captured and p.module_runs]
        times = {c: g["time_ns"] / 1e6 for c, g in prof.by_category().items() if g["time_ns"]}
        return {"ops": sum(times.values()), **{f"ops {c}": t for c, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODELS), default="d512")
    parser.add_argument("--concurrency", type=int, default=1, help="sequences decoding together")
    parser.add_argument("--context", type=int, default=4, help="tokens decoded before the step")
    parser.add_argument("--json")
    args = parser.parse_args()
    config = MODELS[args.model]
    base = nnlib.Transformer(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, config.vocab_size, 128).tolist() for _ in range(args.concurrency)]
    with measure_conditions(PACKAGES) as conditions:
        variants = {
            "float32": DecodeStep(base, prompts, args.context),
            "int8 weight-only": DecodeStep(quantized(base, "int8"), prompts, args.context),
        }
        rows = {name: {"step": [], "model program": []} for name in variants}
        for _ in range(args.rounds):
            for name, v in variants.items():
                rows[name]["step"].append(statistics.median(v.step_ms()))
                rows[name]["model program"].append(v.model_ms())
        table = {
            name: {
                **{k: statistics.median(r) for k, r in rows[name].items()},
                **variants[name].op_ms(),
            }
            for name in variants
        }
    print(conditions_markdown(conditions.as_dict()))
    print(f"median ms per decode step (c={args.concurrency}, {args.model})")
    for name, t in table.items():
        print(f"  {name:18s} " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        settings |= {"options": OPTIONS, "prompt_tokens": 128}
        with open(args.json, "w") as f:
            results = {"ms": table, "rounds": rows, "settings": settings}
            json.dump({**results, "conditions": conditions.as_dict()}, f, indent=1)


if __name__ == "__main__":
    main()
