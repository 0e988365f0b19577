"""Trains the `test` preset into argv[1] for argv[2] steps; with argv[3] = K, SIGKILLs itself
right after step K once the checkpoint of step K - 2 is committed (checkpoint.every=2)."""

import os
import pathlib
import signal
import sys
import time

from jaxstack.trainer import load_config, train

run_dir, steps = sys.argv[1], int(sys.argv[2])
kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else None


def killer(step, state, metrics):
    if step == kill_at:
        committed = pathlib.Path(run_dir) / "checkpoints" / f"step_{kill_at - 2:08d}"
        deadline = time.time() + 60
        while not committed.is_dir() and time.time() < deadline:
            time.sleep(0.05)
        print(f"KILLING at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


config = load_config(
    "test",
    [
        f"log.run_dir={run_dir}",
        f"train.steps={steps}",
        "checkpoint.every=2",
        "checkpoint.max_to_keep=3",
        "eval.every=0",
        "log.sample_tokens=0",
    ],
)
result = train(config, callbacks=[killer])
print(f"DONE step {result.step}", flush=True)
