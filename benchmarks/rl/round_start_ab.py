"""GRPO iterations whose next round starts beside the update (rl 0.11.3) or after it.

    nice -n 19 .venv/bin/python benchmarks/rl/round_start_ab.py [--case grpo] [--pairs 4]
        [--steps 40] [--work /tmp/grpo-breakdown]

A same-process A/B of whole runs at vs_trl.py's GRPO setting (its jaxstack side: 16 prompts x 8
completions, `--case grpo`: at most 4 tokens, `grpo-32`: at most 32; the start model
grpo_breakdown.py makes under `--work`). A run starts each round beside the previous update
unless an evaluation follows the update, so the "after" runs pass an `evaluate` callback that
returns at once (no sampling) with `eval.every=1`. `--pairs` pairs of runs alternate which side
goes first; each run gives its median iteration over the iterations after the first 5
(compiles). Prints each run's median, the median of each side and of the per-pair ratios, and
the load average.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import vs_trl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", choices=["grpo", "grpo-32"], default="grpo")
    p.add_argument("--pairs", type=int, default=4, help="pairs of runs (one of each side)")
    p.add_argument("--steps", type=int, default=40, help="iterations per run (> 5)")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/grpo-breakdown"))
    args = p.parse_args()
    from jaxstack import rl

    model = args.work / "start" / "model"
    if not model.exists():
        raise SystemExit(f"no start model at {model}: run grpo_breakdown.py once first")
    run_grpo, load_config = rl.grpo, rl.load_config

    def median_iteration(beside: bool) -> float:
        """One vs_trl.py jaxstack-side run; its median iteration in seconds."""
        after = {} if beside else {"evaluate": lambda step, generate: {}}
        rl.grpo = lambda config, *a, **k: run_grpo(config, *a, **k, **after)
        every = [] if beside else ["eval.every=1"]
        rl.load_config = lambda algorithm, preset, o: load_config(algorithm, preset, [*o, *every])
        run_dir = args.work / "round-start-ab"
        shutil.rmtree(run_dir, ignore_errors=True)
        step_times = vs_trl.jaxstack_side(args.case, model, args.steps, run_dir)[0]
        return statistics.median(step_times[5:])

    runs: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    for pair in range(args.pairs):
        for beside in (pair % 2 == 0, pair % 2 == 1):
            runs[beside].append(median_iteration(beside))
        ratios.append(runs[False][-1] / runs[True][-1])
    for beside, label in ((False, "after "), (True, "beside")):
        times = " / ".join(f"{t * 1e3:.1f}" for t in runs[beside])
        median = statistics.median(runs[beside]) * 1e3
        print(f"{args.case}, next round started {label}: runs {times} ms, median {median:.1f} ms")
    print(
        f"after / beside per pair: {', '.join(f'{r:.3f}' for r in ratios)}; median "
        f"{statistics.median(ratios):.3f}, load {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
