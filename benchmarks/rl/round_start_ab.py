"""GRPO iterations whose next round starts beside the update (rl 0.11.3) or after it.

    nice -n 19 .venv/bin/python benchmarks/rl/round_start_ab.py [--case grpo] [--iterations 400]
        [--work /tmp/grpo-breakdown]

A same-process A/B at vs_trl.py's GRPO setting (16 prompts x 8 completions, `--case grpo`: at
most 4 tokens, `grpo-32`: at most 32; the start model grpo_breakdown.py makes under `--work`).
The iterations run in blocks of four, alternately starting the next round beside the update and
after it; the first iteration of each block is left out (it is the only one whose own round was
started the other way), and so are the first 40 (compiles). Prints each side's median iteration
(with its quartiles), the ratio of the medians, and the load average.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import vs_trl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", choices=["grpo", "grpo-32"], default="grpo")
    p.add_argument("--iterations", type=int, default=400, help="iterations (> 40)")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/grpo-breakdown"))
    args = p.parse_args()
    from jaxstack import rl
    from jaxstack.rl._src import online
    from jaxstack.rl._src.placement import place_roles
    from jaxstack.rl._src.policy import build_policy
    from jaxstack.rl._src.rewards import as_rewards

    model = args.work / "start" / "model"
    if not model.exists():
        raise SystemExit(f"no start model at {model}: run grpo_breakdown.py once first")
    _, max_new_tokens = vs_trl.CASES[args.case]
    config = rl.load_config(
        "grpo",
        "tiny-grpo",
        [
            f"init.hf={model}",
            f"log.run_dir={args.work / 'round-start-ab'}",
            f"data.batch_size={vs_trl.GRPO['batch_size']}",
            f"data.seq_len={vs_trl.MAX_LENGTH[args.case]}",
            f"rollout.group_size={vs_trl.GRPO['group_size']}",
            f"rollout.max_new_tokens={max_new_tokens}",
            f"grpo.kl_coef={vs_trl.GRPO['kl_coef']}",
            f"optim.lr={vs_trl.SETTINGS['learning_rate']}",
        ],
    )
    policy, roles = build_policy(config), place_roles(config)
    rollouter = online.Rollouter(config, policy, as_rewards(config.rewards), roles)
    update = online.GrpoUpdate(config, policy, roles)
    state = update.initial_state()
    rounds = len(rollouter.order)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.iterations):
        beside = (i // 4) % 2 == 1
        iteration = i % rounds
        t = time.perf_counter()
        state, _ = update.iteration(state, iteration, rollouter, beside and iteration + 1 < rounds)
        if i >= 40 and i % 4 and iteration:
            times[beside].append(time.perf_counter() - t)
    for beside, label in ((False, "after "), (True, "beside")):
        q1, median, q3 = statistics.quantiles(times[beside], n=4)
        print(
            f"{args.case} next round started {label}: iteration {median * 1e3:.2f} ms "
            f"(quartiles {q1 * 1e3:.2f} / {q3 * 1e3:.2f}, {len(times[beside])} iterations)"
        )
    ratio = statistics.median(times[False]) / statistics.median(times[True])
    print(f"after / beside: {ratio:.3f}, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
