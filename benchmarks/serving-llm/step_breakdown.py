"""Where a c=1 decode step's time goes, float32 against weight-only int8 (issue 31, goal 3).

engine_ab's d=512 model (8 heads of 64, MLP 1,536, 4 layers, vocabulary 8,000) as float32 and
as quantlib's `int8` preset (per-channel int8 weights, every Dense), each served by `LLM` with
issue 31's settings. Per variant, in alternating rounds: `LLMEngine.step()` of a lone sampled
decode (all host work included), and the step's model program alone (`runner.lower(...)`,
compiled, called on the captured inputs of a real decode) until its logits are ready. Then
20 engine steps under xprof-lite's `trace`, joined with the model program's HLO
(`profile_from_trace`): the program's own op times by category. The model program's wall time
beyond its op times is XLA:CPU's runtime between ops; the step's beyond the model program is
sampling and host work.

    .venv/bin/python benchmarks/serving-llm/step_breakdown.py --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from engine_ab import D512, SAMPLED, quantized
from flax import nnx

from jaxstack import nnlib, xprof_lite
from jaxstack.serving import LLM, SamplingParams

OPTIONS = dict(max_model_len=2048, max_num_seqs=32, max_num_batched_tokens=2048)


class DecodeStep:
    """One variant: its LLM, a real decode's model-program inputs, and timers."""

    def __init__(self, model: nnx.Module, prompt: list[int]):
        self.llm, self.prompt = LLM(model, **OPTIONS), prompt
        runner, seen = self.llm.engine.runner, {}
        # the runner's module (benchmarks use no private imports), whose `_forward` a step calls
        module = sys.modules[type(runner).__module__]
        forward = module._forward

        def spy(leaves, k, v, x, previous, **static):
            seen["x"] = x
            return forward(leaves, k, v, x, previous, **static)

        module._forward = spy
        self.llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))
        module._forward = forward
        self.x = seen["x"]  # a decode: 2 token rows, 1 sequence row
        self.program = runner.lower(1, num_seqs=1).compile()

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
        engine, times = self.llm.engine, []
        params = SamplingParams(max_tokens=steps, ignore_eos=True, seed=1, **SAMPLED)
        engine.add_request(self.prompt, params)
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
    parser.add_argument("--json")
    args = parser.parse_args()
    base = nnlib.Transformer(D512, rngs=nnx.Rngs(0))
    prompt = np.random.default_rng(0).integers(3, D512.vocab_size, 128).tolist()
    variants = {
        "float32": DecodeStep(base, prompt),
        "int8 weight-only": DecodeStep(quantized(base, "int8"), prompt),
    }
    loads = [os.getloadavg()[0]]
    rows = {name: {"step": [], "model program": []} for name in variants}
    for _ in range(args.rounds):
        for name, v in variants.items():
            rows[name]["step"].append(statistics.median(v.step_ms()))
            rows[name]["model program"].append(v.model_ms())
        loads.append(round(os.getloadavg()[0], 2))
    table = {
        name: {
            **{k: statistics.median(r) for k, r in rows[name].items()},
            **variants[name].op_ms(),
        }
        for name in variants
    }
    print(f"median ms per decode step (c=1, d=512); load {loads}")
    for name, t in table.items():
        print(f"  {name:18s} " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ms": table, "rounds": rows, "load": loads, "options": OPTIONS}, f, indent=1)


if __name__ == "__main__":
    main()
