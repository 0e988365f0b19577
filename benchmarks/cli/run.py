"""How long every jaxstack-* console script takes to answer `--help`, in fresh processes.

Each CLI imports JAX (and Flax, Orbax, Grain...) only inside the command that needs it, so
`--help` should print in well under a second; this measures it rather than asserting it in a
test. Every console script the workspace's packages declare (`[project.scripts]`) is run
`--repeats` times as a new process (after one untimed run that warms the disk cache), timing
the wall clock and the CPU time of the child; the table gives the median, the slowest run and
whether the help text printed, plus which heavy libraries (jax, numpy, ...) the `--help` path
imported (read in a separate process through `sys.modules`).

    .venv/bin/python benchmarks/cli/run.py              # 9 CLIs x 7 runs, ~30 s
    .venv/bin/python benchmarks/cli/run.py --quick      # 3 runs each, into benchmarks/cli/quick/
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from conditions import conditions_markdown, measure_conditions  # noqa: E402

LIMIT_S = 1.0
# Run in the child after the CLI's main() handled --help: which heavy libraries it loaded.
PROBE = """
import importlib, sys
module, function = sys.argv[1].split(":")
sys.argv = [sys.argv[2], "--help"]
try:
    getattr(importlib.import_module(module), function)()
except SystemExit:
    pass
sys.stdout.flush()
heavy = ("jax", "flax", "orbax", "grain", "matplotlib", "numpy")
print("\\nIMPORTED=" + ",".join(m for m in heavy if m in sys.modules), file=sys.stderr)
"""


def console_scripts() -> dict[str, tuple[str, str]]:
    """Script name -> (distribution, `module:function`), from every package's pyproject."""
    scripts = {}
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for name, target in project.get("scripts", {}).items():
            scripts[name] = (project["name"], target)
    return scripts


def executable(name: str) -> Path:
    found = Path(sys.executable).parent / name
    if not found.exists():
        sys.exit(f"{found} is missing: run `uv sync --all-packages` from {ROOT} first")
    return found


def time_once(command: list[str]) -> tuple[float, float, bool]:
    """Wall seconds, child CPU seconds, and whether it printed a usage line and exited 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode == 0 and "usage" in done.stdout.lower()


def imported_on_help(target: str, name: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, target, name], capture_output=True, text=True, timeout=120
    )
    line = next((x for x in done.stderr.splitlines() if x.startswith("IMPORTED=")), "IMPORTED=")
    return [m for m in line.removeprefix("IMPORTED=").split(",") if m]


def measure(repeats: int) -> list[dict]:
    rows = []
    for name, (distribution, target) in console_scripts().items():
        command = [str(executable(name)), "--help"]
        time_once(command)  # untimed: fills the page cache with this CLI's modules
        runs = [time_once(command) for _ in range(repeats)]
        walls = [w for w, _, _ in runs]
        rows.append(
            {
                "cli": name,
                "distribution": distribution,
                "entry_point": target,
                "median_s": statistics.median(walls),
                "max_s": max(walls),
                "median_cpu_s": statistics.median(c for _, c, _ in runs),
                "runs_s": walls,
                "help_printed": all(ok for _, _, ok in runs),
                "imports_on_help": imported_on_help(target, name),
            }
        )
        print(f"{name:24s} median {rows[-1]['median_s']:.3f} s  max {rows[-1]['max_s']:.3f} s")
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# `--help` of every jaxstack CLI",
        "",
        conditions_markdown(meta["conditions"]),
        "",
        f"Fresh processes, {meta['repeats']} timed runs each after one untimed warm-up; the goal "
        f"is under {LIMIT_S:g} s. 'imports' lists which of jax, flax, orbax, grain, matplotlib "
        "and numpy the `--help` path loaded.",
        "",
        "| CLI | package | median s | max s | median CPU s | help printed | imports | "
        f"under {LIMIT_S:g} s |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['cli']}` | {r['distribution']} | {r['median_s']:.3f} | {r['max_s']:.3f} | "
            f"{r['median_cpu_s']:.3f} | {'yes' if r['help_printed'] else 'NO'} | "
            f"{', '.join(r['imports_on_help']) or 'none'} | "
            f"{'yes' if r['median_s'] < LIMIT_S else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per CLI (default 7)")
    parser.add_argument("--quick", action="store_true", help="3 runs each, into quick/")
    parser.add_argument("--out", type=Path, help="output folder (default: this folder)")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    out = args.out or (HERE / "quick" if args.quick else HERE)
    distributions = sorted({d for d, _ in console_scripts().values()})
    with measure_conditions(packages=["jax", *distributions], sample_every_s=2.0) as conditions:
        rows = measure(repeats)
    meta = {"repeats": repeats, "limit_s": LIMIT_S, "conditions": conditions.as_dict()}
    meta["conditions"]["env_JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (out / "results.md").write_text(markdown(rows, meta))
    print(f"wrote {out / 'results.md'} and results.json")
    slow = [r["cli"] for r in rows if r["median_s"] >= LIMIT_S or not r["help_printed"]]
    if slow:
        sys.exit(f"over {LIMIT_S:g} s or no help text: {', '.join(slow)}")


if __name__ == "__main__":
    main()
