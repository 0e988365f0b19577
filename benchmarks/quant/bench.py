"""One round of the quantisation benchmark, as `benchmarks/run_all.py` runs it.

`run.py` (perplexity, bytes, QAT, bare decode step; quantlib and Qwix) and `llm_decode.py`
(decode through `LLM(...)`) measure trained runs. This script makes those runs once per
machine, into `--models` (default `benchmarks/quant/models/`, ignored by git), with the
commands the README gives: the tiny default model after 400 steps and a d=512 model after
300 (about 8 and 10 minutes on 2 idle cores), plus their int8 and int4 `jaxstack-quant ptq`
outputs. Later rounds reuse them, so every round measures the same weights. Then it runs both
scripts and writes `results.json` / `results.md` into `--out` with both parts and the run
conditions of the measuring (not the training).

    .venv/bin/python benchmarks/quant/bench.py --out /tmp/quant-round
    .venv/bin/python benchmarks/quant/bench.py --quick          # 20-step tiny model, into quick/

Qwix runs where a Python with qwix is found (`--qwix-python`, else `$JAXSTACK_QWIX_PYTHON`,
else /tmp/qwixvenv/bin/python; the README says how to make one); without it the Qwix columns
say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conditions import measure_conditions  # noqa: E402

TRAIN_COMMON = [
    "log.sample_tokens=0",
    "log.report=false",
    "log.tensorboard=false",
]
MODELS = {  # name -> jaxstack-train overrides (README "Reproduce")
    "tiny": ["train.steps=400", "eval.every=50", "checkpoint.every=400"],
    "d512": [
        "model.d_model=512",
        "model.num_heads=8",
        "model.num_kv_heads=8",
        "model.mlp_dim=2048",
        "model.num_layers=2",
        "train.steps=300",
        "eval.every=50",
        "checkpoint.every=300",
    ],
}
QUICK_MODELS = {
    "quick-tiny": [
        "train.steps=30",
        "optim.schedule.warmup_steps=5",
        "eval.every=30",
        "checkpoint.every=30",
    ]
}
LLM_FORMATS = ("int8", "int4")


def script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def ensure_run(models: Path, name: str, overrides: list[str]) -> Path:
    """The trained run `name` under `models`, trained (and its PTQ outputs made) if absent.
    A `<name>.done` file marks a finished one, so an interrupted training is redone."""
    run, done = models / name, models / f"{name}.done"
    if done.exists():
        return run
    shutil.rmtree(run, ignore_errors=True)
    for fmt in LLM_FORMATS:
        shutil.rmtree(models / f"{name}-{fmt}", ignore_errors=True)
    train = [script("jaxstack-train"), *overrides, *TRAIN_COMMON, f"log.run_dir={run}"]
    print(f"training {name} once for this machine: {' '.join(train)}", flush=True)
    subprocess.run(train, check=True)
    for fmt in LLM_FORMATS:
        ptq = [script("jaxstack-quant"), "ptq", str(run), "--rules", fmt]
        subprocess.run([*ptq, "--out", str(models / f"{name}-{fmt}")], check=True)
    done.write_text(json.dumps({"train": train}) + "\n")
    return run


def qwix_python(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("JAXSTACK_QWIX_PYTHON"), "/tmp/qwixvenv/bin/python"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="round folder (default: quick/ with --quick)")
    parser.add_argument("--models", type=Path, default=HERE / "models")
    parser.add_argument("--qwix-python", help="a Python with qwix and the workspace packages")
    parser.add_argument("--quick", action="store_true", help="a 30-step tiny model, smoke sizes")
    args = parser.parse_args(argv)
    out = args.out or (HERE / "quick" if args.quick else None)
    if out is None:
        parser.error("--out is required without --quick")
    args.models.mkdir(parents=True, exist_ok=True)
    runs = {
        name: ensure_run(args.models, name, overrides)
        for name, overrides in (QUICK_MODELS if args.quick else MODELS).items()
    }
    largest = list(runs)[-1]  # int8's gain through the engine shows on the larger matmuls
    qwix = qwix_python(args.qwix_python)
    ptq = [sys.executable, str(HERE / "run.py"), "--out", str(out / "ptq")]
    ptq += [f"--run={name}={run}" for name, run in runs.items()]
    ptq += [f"--qwix-python={qwix}"] if qwix else []
    llm = [sys.executable, str(HERE / "llm_decode.py"), "--float", str(runs[largest])]
    llm += [f"--quant={fmt}={args.models / f'{largest}-{fmt}'}" for fmt in LLM_FORMATS]
    llm += ["--out", str(out / "llm-decode")]
    if args.quick:
        ptq += ["--eval-batches=2", "--qat-steps=2", "--decode-steps=6", "--decode-rounds=1"]
        llm += ["--tokens=8", "--prompts=1", "--rounds=1"]
    (out / "ptq").mkdir(parents=True, exist_ok=True)
    packages = ["jax", "flax", "jaxstack-quantlib", "jaxstack-kernlib", "jaxstack-serving"]
    with measure_conditions(packages) as conditions:
        subprocess.run(ptq, check=True)
        subprocess.run(llm, check=True)
    ptq_results = json.loads((out / "ptq" / "results.json").read_text())
    models = ptq_results["models"]
    broken = {n: m["qwix"]["error"] for n, m in models.items() if "error" in m["qwix"]}
    if broken:  # a Qwix Python was found but failed: a broken setup, not a missing peer
        sys.exit(f"the Qwix side failed with {qwix}: {broken}; fix that Python (README.md)")
    results = {
        "conditions": conditions.as_dict(),
        "settings": {
            "models": {n: str(r) for n, r in runs.items()},
            "qwix_python": qwix,
            "llm_decode_model": largest,
        },
        "ptq": ptq_results,
        "llm_decode": json.loads((out / "llm-decode" / "results-llm-decode.json").read_text()),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    text = (
        (out / "ptq" / "results.md").read_text()
        + "\n"
        + (out / "llm-decode" / "results-llm-decode.md").read_text().replace("# ", "## ", 1)
    )
    (out / "results.md").write_text(text)
    print(f"wrote {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
