"""Decode speed of quantised weights through the serving engine (`jaxstack.serving.LLM`), next to
the bare decode step that `run.py` times.

`run.py` times nnlib's decode step alone (one jitted call with a KV cache, batch 1). A user
serving the model sees the engine around that step: scheduling, the paged KV cache, sampling,
detokenising. This script loads the same run as float32 and as `jaxstack-quant ptq` outputs,
and times greedy generation of one prompt at a time through `LLM(...)`, in interleaved rounds
(float, int8, int4, float, ...) so that a machine whose load drifts favours none.

    python benchmarks/quant/llm_decode.py --float runs/tutorial \\
        --quant int8=runs/tutorial-int8 --quant int4=runs/tutorial-int4 --out benchmarks/quant

Writes `results-llm-decode.json` and `.md` into --out: output tokens/s per model and round, and
each quantised model's per-round ratio to float32 (median and [min, max]).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conditions import conditions_markdown, measure_conditions


def tokens_per_second(llm, sampling, prompts: list[str]) -> float:
    """Output tokens per second of greedy generation, one prompt at a time (batch 1)."""
    tokens, start = 0, time.perf_counter()
    for prompt in prompts:
        [output] = llm.generate([prompt], sampling)
        tokens += len(output.outputs[0].token_ids)
    return tokens / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--float", required=True, help="the float32 run (a jaxstack-train run)")
    parser.add_argument("--quant", action="append", default=[], help="NAME=DIR of a ptq output")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per prompt")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
    args = parser.parse_args(argv)

    from jaxstack.serving import LLM, SamplingParams

    models = {"float32": args.float, **dict(q.split("=", 1) for q in args.quant)}
    sampling = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    prompts = [f"def f{i}(" for i in range(args.prompts)]
    with measure_conditions(packages=["jax", "jaxstack-serving", "jaxstack-quantlib"]) as cond:
        llms = {name: LLM(path) for name, path in models.items()}
        for llm in llms.values():  # compile every shape the rounds use
            tokens_per_second(llm, sampling, prompts[:1])
        rounds = [
            {name: tokens_per_second(llm, sampling, prompts) for name, llm in llms.items()}
            for _ in range(args.rounds)
        ]
    ratios = {
        name: [r[name] / r["float32"] for r in rounds] for name in models if name != "float32"
    }
    meta = {"settings": vars(args) | {"out": str(args.out)}, "conditions": cond.as_dict()}
    result = {"meta": meta, "rounds": rounds, "ratio_to_float32": ratios}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results-llm-decode.json").write_text(json.dumps(result, indent=1, default=str))
    folders = ", ".join(f"{name} `{pathlib.Path(path).name}`" for name, path in models.items())
    lines = [
        "# Decode through the serving engine (`LLM(...)`), batch 1, greedy",
        "",
        conditions_markdown(meta["conditions"]),
        "",
        f"Models (run folders): {folders}; "
        f"{args.prompts} prompts x {args.tokens} output tokens per round, "
        f"{args.rounds} interleaved rounds.",
        "",
        "| model | output tokens/s (median of rounds) | per-round ratio to float32: median "
        "[min, max] |",
        "|---|---|---|",
    ]
    for name in models:
        tps = statistics.median(r[name] for r in rounds)
        if name == "float32":
            lines.append(f"| {name} | {tps:,.1f} | 1 |")
            continue
        rs = ratios[name]
        span = f"{statistics.median(rs):.2f}x [{min(rs):.2f}, {max(rs):.2f}]"
        verdict = " (parity)" if min(rs) <= 1.0 <= max(rs) else ""
        lines.append(f"| {name} | {tps:,.1f} | {span}{verdict} |")
    (args.out / "results-llm-decode.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
