"""Every kernlib Mosaic TPU kernel compiled ahead of time for v5e, v5p and v6e, on a CPU host.

Needs libtpu next to jax (`nox -s tpu_aot` installs it; or `pip install libtpu`). Writes
results-tpu-aot.md / .json: per case and chip, compiled or refused (with the compiler's reason),
the compile time, Mosaic calls in the program, and the TPU cost model's figures. Nothing runs on
a chip: the cost model's estimate is not a measurement.

    JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 python benchmarks/kernels/tpu_aot.py
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax

from jaxstack import kernlib

HERE = Path(__file__).parent


def conditions() -> dict:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "host": f"{cpu}, {os.cpu_count()} cores, {platform.system()}",
        "load_average_1m": round(os.getloadavg()[0], 2),
        "jax": jax.__version__,
        "libtpu": importlib.metadata.version("libtpu"),
        "commit": commit,
        "targets": {n: kernlib.TPU_TARGETS[n].topology for n in kernlib.TPU_TARGETS},
    }


def _fmt(value, scale=1.0, digits=1):
    if value is None or value < 0:  # the cost model gives negative figures for what it cannot see
        return "-"
    return f"{value * scale:,.{digits}f}"


def markdown(rows: list[dict], cond: dict) -> str:
    compiled = sum(r["compiled"] for r in rows)
    lines = [
        "# kernlib Mosaic TPU kernels compiled ahead of time",
        "",
        f"{compiled} of {len(rows)} (case, chip) compilations succeeded. Run conditions: "
        + ", ".join(f"{k} {v}" for k, v in cond.items() if k != "targets")
        + "; slices "
        + ", ".join(f"{k} = {v}" for k, v in cond["targets"].items())
        + " (one chip used).",
        "",
        "Cost-model columns are the TPU compiler's estimate for the whole program (a Mosaic "
        "kernel without a cost estimate counts as 0 FLOPs; '-' where the model gave nothing or a "
        "negative figure). Nothing here ran on a chip.",
        "",
        "| kernel case | chip | result | Mosaic calls | compile s | est. GFLOP | est. MB moved "
        "| est. us | temp MiB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_table_row(r) for r in rows]
    return "\n".join(lines) + "\n"


def _table_row(r: dict) -> str:
    cells = [
        r["case"],
        r["chip"],
        "compiled" if r["compiled"] else f"refused: {r['reason']}",
        str(r["mosaic_kernels"]),
        _fmt(r["compile_s"], digits=2),
        _fmt(r["flops"], 1e-9, 3),
        _fmt(r["bytes_accessed"], 1e-6),
        _fmt(r["optimal_seconds"], 1e6),
        _fmt(r["temp_bytes"], 2**-20),
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=list(kernlib.TPU_TARGETS))
    parser.add_argument("--ops", nargs="+", default=None, choices=kernlib.OP_NAMES)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    cond = conditions()
    rows = []
    cases = kernlib.aot_cases(tuple(args.ops) if args.ops else None)
    start = time.perf_counter()
    for target in args.targets:
        device = kernlib.tpu_devices(target)[0]
        for case in cases:
            result = kernlib.aot_compile(case.fn, case.args, device)
            rows.append({"case": case.label, "op": case.op, "chip": target, **result.to_dict()})
            status = "compiled" if result.compiled else f"REFUSED {result.reason}"
            print(f"{target:4} {case.label}: {status}", flush=True)
    cond["total_s"] = round(time.perf_counter() - start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results-tpu-aot.json").write_text(
        json.dumps({"conditions": cond, "results": rows}, indent=1) + "\n"
    )
    (args.out / "results-tpu-aot.md").write_text(markdown(rows, cond))
    print(f"wrote {args.out / 'results-tpu-aot.md'} ({cond['total_s']} s)")


if __name__ == "__main__":
    main()
