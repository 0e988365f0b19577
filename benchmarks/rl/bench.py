"""One round of the rl benchmark, as `benchmarks/run_all.py` runs it.

Runs `vs_trl.py` (DPO, SFT and GRPO against TRL, a few minutes) and, with `--recipe`,
`run.py recipe` (`jaxstack-rl recipe arithmetic`, about 10 minutes on 2 idle cores; run_all
asks for it in the first round only), then `run.py report`, all into `--out`: `results.json`
holds the parts ("vs-trl", "recipe") and the conditions of the whole round.

    .venv/bin/python benchmarks/rl/bench.py --out /tmp/rl-round --recipe
    .venv/bin/python benchmarks/rl/bench.py --quick      # DPO and SFT, 12 steps a side, into quick/

TRL runs in a peers Python (`--peers-python`, else `$JAXSTACK_PEERS_PYTHON`, else
/tmp/peers/bin/python; README.md says how to make one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conditions import measure_conditions  # noqa: E402


def peers_python(given: str | None) -> str:
    for candidate in (given, os.environ.get("JAXSTACK_PEERS_PYTHON"), "/tmp/peers/bin/python"):
        if candidate and Path(candidate).exists():
            return candidate
    sys.exit("no Python with TRL: pass --peers-python (benchmarks/rl/README.md makes one)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="round folder (default: quick/ with --quick)")
    parser.add_argument("--peers-python", help="a Python with torch, transformers and TRL")
    parser.add_argument("--recipe", action="store_true", help="also the arithmetic recipe")
    parser.add_argument("--quick", action="store_true", help="DPO and SFT, 12 steps a side")
    args = parser.parse_args(argv)
    out = args.out or (HERE / "quick" if args.quick else None)
    if out is None:
        parser.error("--out is required without --quick")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("results*.json"):  # a round folder holds this round's parts only
        stale.unlink()
    python = peers_python(args.peers_python)
    vs_trl = [sys.executable, str(HERE / "vs_trl.py"), "--peers-python", python, "--out", str(out)]
    if args.quick:
        vs_trl += ["--steps", "12", "--warmup", "2", "--algorithms", "dpo", "sft"]
    with measure_conditions(["jax", "jaxlib", "flax", "jaxstack-rl"]) as conditions:
        subprocess.run(vs_trl, check=True)
        if args.recipe:
            subprocess.run([sys.executable, str(HERE / "run.py"), "recipe", "--out", str(out)],
                           check=True)  # fmt: skip
    subprocess.run([sys.executable, str(HERE / "run.py"), "report", "--out", str(out)], check=True)
    results = json.loads((out / "results.json").read_text())
    results["conditions"] = conditions.as_dict()
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
