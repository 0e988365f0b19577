"""A/B of LLM servers already running: `vllm bench serve` against each, rounds alternating.

The servers are started beforehand (each from its own checkout or launcher: that is the
variant) and named here with their port and process id; the workload is vs_vllm.py's (random
128-token prompts, 128 output tokens, `--ignore-eos`, temperature 0.8) at each concurrency,
the order of the servers rotating from round to round so that load from other processes falls
on all of them alike. Per server, level and round: output tokens/s, TPOT and TTFT p50 as the
client reports them, and the CPU time of the server's threads over the level, split by
thread (the asyncio/HTTP main thread, the engine thread, XLA's pools), per output token.
The load average is recorded before, during and after (`benchmarks/conditions.py`).

    .venv/bin/python benchmarks/serving-llm/server_ab.py --model /tmp/model \\
        --server before=8101:PID --server now=8102:PID [--levels 8 32] [--rounds 4] \\
        [--json out.json]

The model folder is the one the servers serve (vs_vllm.py's `write_model` makes it; the
client reads its tokenizer). Each server is started as vs_vllm.py starts jaxstack-serve:
`jaxstack-serve --model DIR --port P --max-model-len 2048 --max-num-seqs 32
--served-model-name bench`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import statistics
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from conditions import conditions_markdown, measure_conditions  # noqa: E402
from vs_vllm import run_client  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id and name."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = pathlib.Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = pathlib.Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1]
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        user, system = fields.split()[11:13]
        out[f"{tid}:{name}"] = (int(user) + int(system)) / TICK
    return out


def thread_role(pid: int, key: str) -> str:
    """main (the asyncio loop and HTTP), xla:<pool>, or python (the engine thread and any
    other Python thread)."""
    tid, name = key.split(":", 1)
    if int(tid) == pid:
        return "main"
    return f"xla:{name}" if name.startswith(("tf_", "llvm")) else "python"


def bench_level(vllm_python: str, folder: str, port: int, pid: int, c: int, tmp: str) -> dict:
    before = thread_cpu_s(pid)
    result = run_client(vllm_python, folder, port, c, tmp)
    after = thread_cpu_s(pid)
    tokens = result["total_output_tokens"]
    cpu = collections.Counter()
    for key, seconds in after.items():
        cpu[thread_role(pid, key)] += seconds - before.get(key, 0.0)
    return {
        "output_tokens_per_s": result["output_throughput"],
        "tpot_p50_ms": result["median_tpot_ms"],
        "ttft_p50_ms": result["median_ttft_ms"],
        "cpu_ms_per_token": {k: v * 1e3 / tokens for k, v in sorted(cpu.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the folder the servers serve")
    parser.add_argument("--server", action="append", required=True, help="NAME=PORT:PID")
    parser.add_argument("--levels", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    servers = {}
    for spec in args.server:
        name, _, where = spec.partition("=")
        port, _, pid = where.partition(":")
        servers[name] = (int(port), int(pid))
    names = list(servers)
    rounds: dict = {n: {c: [] for c in args.levels} for n in names}
    packages = ["jaxstack-serving"]
    with tempfile.TemporaryDirectory() as tmp, measure_conditions(packages=packages) as cond:
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for c in args.levels:
                for name in order:
                    level = bench_level(args.vllm_python, args.model, *servers[name], c, tmp)
                    rounds[name][c].append(level)
                    print(f"round {r + 1} {name} c={c}: {json.dumps(level)}", flush=True)
    conditions = cond.as_dict()
    print(conditions_markdown(conditions))
    summary = {}
    for name in names:
        for c in args.levels:
            rs = rounds[name][c]
            row = {
                key: statistics.median(x[key] for x in rs)
                for key in ("output_tokens_per_s", "tpot_p50_ms", "ttft_p50_ms")
            }
            roles = sorted({k for x in rs for k in x["cpu_ms_per_token"]})
            row["cpu_ms_per_token"] = {
                k: statistics.median(x["cpu_ms_per_token"].get(k, 0.0) for x in rs) for k in roles
            }
            summary[f"{name} c={c}"] = row
            cpu = ", ".join(f"{k} {v:.3f}" for k, v in row["cpu_ms_per_token"].items())
            print(
                f"{name:>10} c={c:<3} tok/s {row['output_tokens_per_s']:7.1f}  TPOT p50 "
                f"{row['tpot_p50_ms']:6.2f} ms  TTFT p50 {row['ttft_p50_ms']:7.1f} ms  "
                f"CPU ms/token: {cpu}"
            )
    if len(names) > 1:
        ref = names[0]
        for name in names[1:]:
            for c in args.levels:
                pairs = zip(rounds[name][c], rounds[ref][c], strict=True)
                ratios = [a["output_tokens_per_s"] / b["output_tokens_per_s"] for a, b in pairs]
                tpot = [
                    a["tpot_p50_ms"] / b["tpot_p50_ms"]
                    for a, b in zip(rounds[name][c], rounds[ref][c], strict=True)
                ]
                print(
                    f"{name}/{ref} c={c}: tok/s x{statistics.median(ratios):.3f} "
                    f"[{min(ratios):.3f}, {max(ratios):.3f}], TPOT x{statistics.median(tpot):.3f} "
                    f"[{min(tpot):.3f}, {max(tpot):.3f}]"
                )
    if args.json:
        out = {"conditions": conditions, "servers": args.server, "rounds": rounds}
        args.json.write_text(json.dumps({**out, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
