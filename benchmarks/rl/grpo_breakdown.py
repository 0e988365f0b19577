"""Where a GRPO iteration's time goes, at vs_trl.py's setting: jaxstack's side only.

    nice -n 19 .venv/bin/python benchmarks/rl/grpo_breakdown.py [--case grpo] [--steps 40]
        [--work /tmp/grpo-breakdown] [override ...]

Runs `vs_trl.py`'s jaxstack side for `--case` (the same start model: tiny-sft's after 50 steps,
made once under `--work`) with any extra config overrides (e.g. `train.host_allocator=system`),
then prints the medians over the iterations after the first 5 of the iteration, its rollout
(`rollout_s`: weight hand-off and sampling) and its update (`update_s`: reference log-probs and
the optimiser step), the minor page faults per iteration and the XLA compiles (count and
seconds). Run it back to back with and without a change for an A/B (README.md).
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import shutil
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import vs_trl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", choices=["grpo", "grpo-32"], default="grpo")
    p.add_argument("--steps", type=int, default=40, help="iterations (> 5)")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/grpo-breakdown"))
    p.add_argument("overrides", nargs="*", help="extra config overrides, key=value")
    args = p.parse_args()
    import jax

    from jaxstack import rl
    from jaxstack.trainer import read_jsonl

    compiled = []  # seconds of each XLA compile (engine steps, train step, eager ops)

    def on_event(event: str, seconds: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(on_event)

    model = args.work / "start" / "model"
    if not model.exists():
        rl.sft(
            rl.load_config(
                "sft",
                "tiny-sft",
                [f"log.run_dir={args.work / 'start'}", "train.steps=50", "log.tensorboard=false"],
            )
        )
    load_config = rl.load_config
    rl.load_config = lambda a, preset, o: load_config(a, preset, [*o, *args.overrides])
    run_dir = args.work / f"run-{args.case}"
    shutil.rmtree(run_dir, ignore_errors=True)
    faults, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    compiled.clear()
    vs_trl.jaxstack_side(args.case, model, args.steps, run_dir)
    wall = time.perf_counter() - t
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    medians = {
        key: statistics.median(r[key] for r in records[5:])
        for key in ("step_time_s", "rollout_s", "update_s")
    }
    print(
        f"{args.case} {' '.join(args.overrides)}: iteration {medians['step_time_s'] * 1e3:.1f} ms "
        f"(rollout {medians['rollout_s'] * 1e3:.1f}, update {medians['update_s'] * 1e3:.1f}), "
        f"run {wall:.1f} s, {faults / args.steps:.0f} minor faults an iteration, "
        f"{len(compiled)} XLA compiles taking {sum(compiled):.1f} s"
    )


if __name__ == "__main__":
    main()
