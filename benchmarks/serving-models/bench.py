"""Dynamic batching versus batch size 1: requests/s and p50/p99 latency over loopback HTTP.

For each mode, the model server runs as its own process (`jaxstack-serve-models`, KServe v2
REST on 127.0.0.1), and an asyncio keep-alive HTTP client in this process sends a bounded
number of requests at concurrency 1, 16 and 64. The two modes differ only in
`--max-batch-size` (1 = no batching). Every response is checked for status 200; one per run is
compared with a direct `jax.jit` call.

    .venv/bin/python benchmarks/serving-models/bench.py            # writes results.{json,md}
    .venv/bin/python benchmarks/serving-models/bench.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.client
import itertools
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.serving import export

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from conditions import conditions_markdown, measure_conditions  # noqa: E402

CONCURRENCY = (1, 16, 64)


# -- the model: an MLP scorer, the kind of non-LLM model this server is for -------------------


def init_mlp(sizes: tuple[int, ...], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        f"layer{i}": {
            "kernel": (rng.normal(size=(m, n)) / np.sqrt(m)).astype(np.float32),
            "bias": np.zeros(n, np.float32),
        }
        for i, (m, n) in enumerate(itertools.pairwise(sizes))
    }


def mlp(params: dict, x: jax.Array) -> jax.Array:
    layers = [params[k] for k in sorted(params, key=lambda k: int(k.removeprefix("layer")))]
    for layer in layers[:-1]:
        x = jax.nn.gelu(x @ layer["kernel"] + layer["bias"])
    return jax.nn.log_softmax(x @ layers[-1]["kernel"] + layers[-1]["bias"])


# -- a minimal keep-alive HTTP/1.1 client (one connection per concurrent user) ---------------


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def http_request(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def load(port: int, request: bytes, concurrency: int, total: int) -> dict:
    connections = [await Connection.open(port) for _ in range(concurrency)]
    latencies: list[float] = []
    errors: dict[int, int] = {}
    remaining = total

    async def user(conn: Connection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            status, _ = await conn.post(request)
            latencies.append(time.perf_counter() - start)
            if status != 200:
                errors[status] = errors.get(status, 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(user(c) for c in connections))
    elapsed = time.perf_counter() - start
    for c in connections:
        c.close()
    lat = np.array(latencies) * 1000
    return {
        "concurrency": concurrency,
        "requests": total,
        "errors": errors,
        "seconds": elapsed,
        "requests_per_s": total / elapsed,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


# -- the server process ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(repository: Path, max_batch_size: int, delay_ms: float) -> tuple:
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "jaxstack-serve-models"),
        "--repository", str(repository), "--port", str(port), "--poll-interval", "0",
        "--max-batch-size", str(max_batch_size), "--max-queue-delay-ms", str(delay_ms),
        "--max-queue-size", "1024", "--log-level", "warning",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    # The port opens before the models are loaded; /v2/health/ready answers 200 once they are.
    deadline = time.time() + 300
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5):
                return process, port
        except OSError:
            if time.time() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError("the model server was not ready within 300 s") from None
            time.sleep(0.1)


async def check_once(port: int, request: bytes, expected: np.ndarray) -> None:
    conn = await Connection.open(port)
    status, body = await conn.post(request)
    conn.close()
    assert status == 200, body
    got = np.array(json.loads(body)["outputs"][0]["data"]).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


MODES = {
    # label: (max batch size, max queue delay ms); None = the command-line values
    "batch_size_1": (1, 0.0),
    "dynamic_batching": (None, None),
    "dynamic_batching_no_delay": (None, 0.0),
}


def batch_counters(port: int) -> tuple[float, float, float]:
    """(rows, batches, padding rows) executed so far, from the server's /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()

    def value(name: str) -> float:
        match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    return (
        value("jaxstack_serving_batch_size_sum"),
        value("jaxstack_serving_batch_size_count"),
        value("jaxstack_serving_padding_rows_total"),
    )


def run_all(repository, args, request, expected, counts) -> dict[str, list[dict]]:
    """All modes' servers up at once; runs interleaved round by round, medians reported.

    The machine is shared and its load drifts, so each (mode, concurrency) cell is measured
    `args.rounds` times, alternating modes, and the median run (by requests/s) is kept.
    """
    servers = {}
    try:
        for label, (mbs, delay) in MODES.items():
            mbs = args.max_batch_size if mbs is None else mbs
            delay = args.max_queue_delay_ms if delay is None else delay
            process, port = start_server(repository, mbs, delay)
            servers[label] = (process, port, mbs, delay)
            asyncio.run(check_once(port, request, expected))
            asyncio.run(load(port, request, 8, 50))  # warm connections, caches, allocator
        runs: dict[tuple[str, int], list[dict]] = {}
        for r in range(args.rounds):
            for concurrency in CONCURRENCY:
                for label, (_, port, mbs, delay) in servers.items():
                    before = batch_counters(port)
                    row = asyncio.run(load(port, request, concurrency, counts[concurrency]))
                    rows_run, batches, padding = (
                        a - b for a, b in zip(batch_counters(port), before, strict=True)
                    )
                    row.update(
                        max_batch_size=mbs,
                        max_queue_delay_ms=delay,
                        mean_batch_rows=rows_run / max(batches, 1),
                        padding_fraction=padding / max(rows_run + padding, 1),
                    )
                    runs.setdefault((label, concurrency), []).append(row)
                    print(f"  round {r} {label:26s} c={concurrency:3d}: "
                          f"{row['requests_per_s']:8.1f} req/s  p50 {row['p50_ms']:7.2f} ms  "
                          f"p99 {row['p99_ms']:7.2f} ms  batch {row['mean_batch_rows']:5.1f} "
                          f"pad {row['padding_fraction']:.0%}  errors {row['errors']}",
                          flush=True)  # fmt: skip
    finally:
        for process, *_ in servers.values():
            process.terminate()
            process.wait(60)
    modes = {}
    for label in MODES:
        modes[label] = []
        for concurrency in CONCURRENCY:
            cell = sorted(runs[(label, concurrency)], key=lambda x: x["requests_per_s"])
            median = dict(cell[len(cell) // 2])
            median["requests_per_s_all_rounds"] = [x["requests_per_s"] for x in cell]
            median["errors_all_rounds"] = sum(sum(x["errors"].values()) for x in cell)
            modes[label].append(median)
    return modes


def in_process_rows_per_s(params, x: np.ndarray, batch: int, seconds: float = 1.0) -> float:
    """Context: what the model itself does without HTTP, per row, at a given batch size."""
    f = jax.jit(mlp)
    xb = jnp.asarray(np.repeat(x, batch, axis=0))
    jax.block_until_ready(f(params, xb))
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        jax.block_until_ready(f(params, xb))
        n += 1
    return n * batch / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="few requests (smoke run)")
    p.add_argument("--sizes", default="64,4096,4096,16", help="MLP layer sizes")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions (median kept)")
    p.add_argument("--out", default=str(HERE))
    args = p.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    counts = {1: 40, 16: 160, 64: 320} if args.quick else {1: 100, 16: 400, 64: 800}

    params = init_mlp(sizes)
    x = np.random.default_rng(1).normal(size=(1, sizes[0])).astype(np.float32)
    expected = np.asarray(jax.jit(mlp)(params, x))
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, sizes[0]], "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()  # fmt: skip
    request = http_request("/v2/models/scorer/infer", body)
    packages = ["jax", "jaxlib", "jaxstack-serving", "fastapi", "uvicorn", "orjson"]
    with (
        measure_conditions(packages=packages) as conditions,
        tempfile.TemporaryDirectory() as tmp,
    ):
        repository = Path(tmp)
        export(mlp, params, {"x": x}, name="scorer", version=1, repository=repository)
        modes = run_all(repository, args, request, expected, counts)
        device_params = jax.device_put(params)
        batches = (1, args.max_batch_size)
        reference = {f"batch_{b}": in_process_rows_per_s(device_params, x, b) for b in batches}
    results = {
        "conditions": conditions.as_dict(),
        "benchmark": "serving-models",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": {
            "kind": "MLP scorer",
            "sizes": sizes,
            "parameters": int(sum(v.size for layer in params.values() for v in layer.values())),
        },
        "server": {
            "max_batch_size": args.max_batch_size,
            "max_queue_delay_ms": args.max_queue_delay_ms,
            "transport": "HTTP/1.1 JSON, "
            "KServe v2, 127.0.0.1, keep-alive, one connection per concurrent client",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
        "quick": args.quick,
        "rounds": args.rounds,
        "modes": modes,
        "speedup_requests_per_s": {
            label: {
                str(c["concurrency"]): b["requests_per_s"] / c["requests_per_s"]
                for c, b in zip(modes["batch_size_1"], modes[label], strict=True)
            }
            for label in MODES
            if label != "batch_size_1"
        },
        "in_process_jit_rows_per_s": reference,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))


def markdown(r: dict) -> str:
    m, server = r["model"], r["server"]
    lines = [
        "# serving-models results",
        "",
        conditions_markdown(r["conditions"]),
        "",
        f"{r['date']}; {m['kind']} {list(m['sizes'])} ({m['parameters']:,} parameters, float32); "
        f"jax {r['machine']['jax']} on {r['machine']['backend']}, {r['machine']['cpus']} CPUs. "
        f"Dynamic batching: max batch size {server['max_batch_size']}, max queue delay "
        f"{server['max_queue_delay_ms']} ms (and 0 ms); baseline: max batch size 1, same server "
        f"code. Median of {r['rounds']} interleaved rounds per cell.",
        "",
        f"Transport: {server['transport']}. The modes ran interleaved."
        + (" Quick (smoke) run: few requests." if r["quick"] else ""),
        "",
        "| concurrency | mode | requests | req/s (median) | speedup vs batch 1 | p50 ms "
        "| p99 ms | mean batch rows | padding | req/s, all rounds | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for i, concurrency in enumerate(CONCURRENCY):
        for label, rows in r["modes"].items():
            row = rows[i]
            speedup = r["speedup_requests_per_s"].get(label, {}).get(str(concurrency), 1.0)
            every = ", ".join(f"{x:.0f}" for x in row["requests_per_s_all_rounds"])
            lines.append(
                f"| {concurrency} | {label} | {row['requests']} | {row['requests_per_s']:.0f} | "
                f"{speedup:.2f}x | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
                f"{row['mean_batch_rows']:.1f} | {row['padding_fraction']:.0%} | {every} | "
                f"{row['errors_all_rounds']} |"
            )
    ref = r["in_process_jit_rows_per_s"]
    lines += [
        "",
        "In-process `jax.jit` of the same model, weights on device, no HTTP (the ceiling): "
        + ", ".join(f"{k.replace('_', ' ')}: {v:.0f} rows/s" for k, v in ref.items())
        + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
