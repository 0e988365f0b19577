"""The op profile of a 32-sequence decode step, page-major against head-major KV cache.

engine_ab's model (issue 31's: d=256, 4 layers, 4 heads, float32) served by `LLM` at issue 31's
settings; 32 sampled prompts of 128 tokens decode while xprof-lite's `trace` records 20 engine
steps, joined with the 32-row decode program's HLO (`profile_from_trace`). Per layout: the
program's op time per step, its largest ops, and the time of its transpose fusions (the copies
XLA:CPU makes of every gathered key and value for a page-major cache).

    .venv/bin/python benchmarks/serving-llm/kvlayout_ops.py --json out.json
"""

from __future__ import annotations

import argparse
import json
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
    runs = prof.module_runs
    per_step = lambda ns: ns / 1e6 / runs
    transposes = [op for op in prof.ops if "transpose" in op.name]
    return {
        "kv_layout": runner.kv_layout,
        "module_runs": runs,
        "ops_ms_per_step": per_step(prof.total_time_ns),
        "transpose_fusions_ms_per_step": per_step(sum(op.time_ns or 0 for op in transposes)),
        "top_ops": [
            {"name": op.name, "shape": op.shape, "ms_per_step": per_step(op.time_ns or 0)}
            for op in prof.top(8)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    model = nnlib.Transformer(MODEL, rngs=nnx.Rngs(0))
    out = {
        "page-major cache (before)": profile(model, page_major_cache),
        "head-major cache": profile(model, None),
    }
    for name, p in out.items():
        print(
            f"{name} ({p['kv_layout']}, {p['module_runs']} steps): ops {p['ops_ms_per_step']:.2f}"
            f" ms/step, transpose fusions {p['transpose_fusions_ms_per_step']:.2f} ms/step"
        )
        for op in p["top_ops"]:
            print(f"    {op['ms_per_step']:7.3f} ms  {op['name']:40s} {op['shape']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"options": OPTIONS, "seqs": SEQS, "profiles": out}, f, indent=1)


if __name__ == "__main__":
    main()
