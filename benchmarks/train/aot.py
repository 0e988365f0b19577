"""The llama-family presets' train steps compiled ahead of time for TPU slices, on a CPU host.

`jaxstack.trainer.aot_train_compile` (what `jaxstack-train --aot-topology` runs) per (preset,
slice): memory per chip against HBM, model FLOPs per step, and the step time and MFU the TPU
cost model predicts, next to MaxText's published MFU for the same model and chip count where
MaxText publishes one (docs/reference/models/tiering.md in AI-Hypercomputer/maxtext). Needs
libtpu next to jax; writes results-aot.md / results-aot.json here.

    JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 python benchmarks/train/aot.py
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
import traceback
from pathlib import Path

for _name, _value in {
    "JAX_PLATFORMS": "cpu",
    "TPU_SKIP_MDS_QUERY": "1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}.items():
    os.environ.setdefault(_name, _value)

import jax  # noqa: E402

from jaxstack import xprof_lite  # noqa: E402
from jaxstack.trainer import aot_train_compile, load_config  # noqa: E402

HERE = Path(__file__).parent
MAXTEXT = "MaxText tiering.md"
# (preset, slice, mesh or None for the preset's, overrides, MaxText's published MFU for the same
# model and chip count where it publishes one)
CASES = [
    ("llama3-8b", "v5p-128", None, [], None),
    ("llama3-8b", "v5p-128", {"data": 16, "fsdp": 4}, [], None),
    ("qwen2-7b", "v5p-128", {"data": 16, "fsdp": 4}, [], None),
    ("llama3-8b", "v6e-256", None, ["data.seq_len=8192"], "45.46%: Llama 3.1 8B, 256 chips, 8k"),
    ("qwen2-7b", "v5e-256", None, [], None),
    ("mixtral-8x7b", "v5p-512", None, [], "52.56%: Mixtral 8x7B, 256 chips (8x4x4), SL=4096"),
]


def conditions() -> dict:
    cpu = xprof_lite.host_cpu()
    git = ["git", "rev-parse", "--short", "HEAD"]
    cond = {"date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")}
    cond["host"] = f"{cpu.model}, {cpu.cores} cores, {platform.system()}"
    cond["load_average_1m"] = round(os.getloadavg()[0], 2)
    cond["jax"], cond["libtpu"] = jax.__version__, importlib.metadata.version("libtpu")
    cond["commit"] = subprocess.run(git, capture_output=True, text=True, cwd=HERE).stdout.strip()
    return cond


def run_case(preset: str, slice_name: str, mesh, overrides: list[str], maxtext) -> dict:
    row = {"preset": preset, "slice": slice_name, "overrides": overrides, "maxtext_mfu": maxtext}
    row["mesh"] = "preset's" if mesh is None else ",".join(f"{a}={n}" for a, n in mesh.items())
    start = time.perf_counter()
    try:
        report = aot_train_compile(load_config(preset, overrides), slice_name, mesh)
    except Exception as e:  # a refusal is a result (out of HBM, a compiler error)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:400]}"
        traceback.print_exc()
    else:
        row.update(report)
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


def markdown(rows: list[dict], cond: dict) -> str:
    lines = [
        "# Train steps compiled ahead of time for TPU slices (nothing ran on a chip)",
        "",
        "Run conditions: " + ", ".join(f"{k} {v}" for k, v in cond.items()) + ".",
        "",
        "Memory is the TPU compiler's per-chip figure (arguments + outputs + temporaries - "
        "aliased); HBM from xprof-lite's device table. Predicted step time is the TPU cost "
        "model's, which sees the scanned layer loop once, scaled by the model FLOPs it did not "
        "see; MFU is model FLOPs per chip / (predicted time x bf16 peak). Predictions, not "
        f"measurements. MaxText's MFU is measured on chips ({MAXTEXT}), for its own configs.",
        "",
        "| preset | slice | mesh | batch | params | GiB per chip (args / temp / peak) | HBM GiB "
        "| fits | TFLOP per chip per step | predicted step s | predicted MFU | MaxText MFU "
        "| compile s |",
        "|---|---|---|---|---:|---|---:|---|---:|---:|---:|---|---:|",
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cells(r: dict) -> list[str]:
    gib = lambda b: "-" if b is None else f"{b / 2**30:,.1f}"
    head = [r["preset"], r["slice"], r["mesh"]]
    if "error" in r:
        return [*head, "-", "-", f"refused: {r['error']}", "-", "no", "-", "-", "-",
                r["maxtext_mfu"] or "-", str(r["wall_s"])]  # fmt: skip
    mfu = r.get("predicted_mfu")
    return [
        *head,
        r["batch"],
        f"{r['num_params'] / 1e9:.2f} B",
        " / ".join(gib(r.get(f"{k}_bytes_per_device")) for k in ("argument", "temp", "peak")),
        gib(r.get("hbm_bytes_per_chip")),
        "yes" if r.get("fits_hbm") else "NO",
        f"{r['model_flops_per_step_per_device'] / 1e12:,.1f}",
        f"{r.get('predicted_step_seconds', float('nan')):.2f}",
        "-" if mfu is None else f"{mfu:.1%}",
        r["maxtext_mfu"] or "-",
        f"{r['seconds']:.0f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="preset@slice pairs to run (default: all)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    cond = conditions()
    rows = []
    for preset, slice_name, mesh, overrides, maxtext in CASES:
        if args.only and f"{preset}@{slice_name}" not in args.only:
            continue
        print(f"compiling {preset} for {slice_name} ...", flush=True)
        rows.append(run_case(preset, slice_name, mesh, overrides, maxtext))
        print(f"  {rows[-1].get('error') or 'compiled'} in {rows[-1]['wall_s']} s", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results-aot.json").write_text(
            json.dumps({"conditions": cond, "results": rows}, indent=1, default=str) + "\n"
        )
        (args.out / "results-aot.md").write_text(markdown(rows, cond))


if __name__ == "__main__":
    main()
