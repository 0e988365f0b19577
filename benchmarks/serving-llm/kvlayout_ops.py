"""The op profile of a 32-sequence decode step, page-major against head-major KV cache.

engine_ab's model (issue 31's: d=256, 4 layers, 4 heads, float32) served by `LLM` at issue 31's
settings; 32 sampled prompts of 128 tokens decode while xprof-lite's `trace` records 20 engine
steps, joined with the 32-row decode program's HLO (`profile_from_trace`). Per layout: the
program's op time per step, its largest ops, the time of its transpose fusions (for a
page-major cache XLA:CPU gathers every key and value into a transposed copy) and of all its copy
fusions (the page gathers, whichever the layout), in rounds whose order alternates.

    .venv/bin/python benchmarks/serving-llm/kvlayout_ops.py --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import numpy as np
from engine_ab import MODEL, SAMPLED, page_major_cache
from flax import nnx

from jaxstack import nnlib, xprof_lite
from jaxstack.serving import LLM, SamplingParams

OPTIONS = dict(max_model_len=2048, max_num_seqs=32, max_num_batched_tokens=2048)
SEQS, PROMPT_LEN = 32, 128


def profile(model, layout_change, steps: int = 20) -> dict:
    llm = LLM(model, **OPTIONS)
    if layout_change is not None:
        layout_change(llm)
    engine, runner = llm.engine, llm.engine.runner
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=steps + 40, ignore_eos=True, seed=0, **SAMPLED)
    for _ in range(SEQS):
        engine.add_request(rng.integers(3, model.config.vocab_size, PROMPT_LEN).tolist(), params)
    while engine.scheduler.waiting or any(
        q.num_computed_tokens < len(q.prompt_token_ids) for q in engine.scheduler.running
    ):
        engine.step()  # prefills, until every sequence decodes
    for _ in range(10):
        engine.step()  # warm decode steps (compiled already)
    program = runner.lower(SEQS, num_seqs=SEQS).compile()
    with tempfile.TemporaryDirectory() as logdir:
        with xprof_lite.trace(logdir, perfetto=False) as capture:
            for _ in range(steps):
                engine.step()
        profiles = xprof_lite.profile_from_trace(capture.profile_data(), [program.as_text()])
    [prof] = [p for p in profiles if p.hlo_captured and p.module_runs]
    per_step = lambda ns: ns / 1e6  # xprof-lite's op times are per module execution
    transposes = [op for op in prof.ops if "transpose" in op.name]
    return {
        "kv_layout": runner.kv_layout,
        "module_runs": prof.module_runs,
        "ops_ms_per_step": per_step(prof.total_time_ns),
        "transpose_fusions_ms_per_step": per_step(sum(op.time_ns or 0 for op in transposes)),
        # the fusions that gather the pages (with the transposition, if any): XLA names them
        # transpose_copy_fusion (page-major) or copy_bitcast_fusion (head-major)
        "copy_fusions_ms_per_step": per_step(
            sum(op.time_ns or 0 for op in prof.ops if "copy" in op.name)
        ),
        "top_ops": [
            {"name": op.name, "shape": op.shape, "ms_per_step": per_step(op.time_ns or 0)}
            for op in prof.top(8)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    model = nnlib.Transformer(MODEL, rngs=nnx.Rngs(0))
    variants = {"page-major cache (before)": page_major_cache, "head-major cache": None}
    rounds = {name: [] for name in variants}
    loads = [round(os.getloadavg()[0], 2)]
    for r in range(args.rounds):  # the order alternates from round to round
        for name in list(variants)[:: 1 if r % 2 == 0 else -1]:
            rounds[name].append(profile(model, variants[name]))
        loads.append(round(os.getloadavg()[0], 2))
    print(f"op time per 32-row decode step, {args.rounds} rounds; load {loads}")
    for name, ps in rounds.items():
        ops = [p["ops_ms_per_step"] for p in ps]
        tr = [p["transpose_fusions_ms_per_step"] for p in ps]
        cp = [p["copy_fusions_ms_per_step"] for p in ps]
        print(
            f"{name}: ops median {statistics.median(ops):.2f} ms/step ({min(ops):.2f}-"
            f"{max(ops):.2f}), transpose fusions {statistics.median(tr):.2f} "
            f"({min(tr):.2f}-{max(tr):.2f}), copy fusions {statistics.median(cp):.2f} "
            f"({min(cp):.2f}-{max(cp):.2f}); largest ops of the last round:"
        )
        for op in ps[-1]["top_ops"]:
            print(f"    {op['ms_per_step']:7.3f} ms  {op['name']:40s} {op['shape']}")
    if args.json:
        with open(args.json, "w") as f:
            out = {"options": OPTIONS, "seqs": SEQS, "load": loads, "rounds": rounds}
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
