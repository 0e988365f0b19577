"""One process of a 2-process CPU run: argv = process_id, port, run_dir, steps[, mode].

mode "report": each process prints `STEP n` after every step, so that a test can send SIGTERM
to one of them mid-run (a preemption notice that reaches one host of a job first).
mode "startup": process 1 sends itself SIGTERM as soon as `train()` has installed its handler,
during start-up (building the session, compiling), before the first step.
A stopped worker exits with the shell's status for its signal (143 for SIGTERM), as
`jaxstack-train` does.
"""

import os
import signal
import sys
import threading
import time

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, run_dir, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

from jaxstack.trainer import load_config, train  # noqa: E402
from jaxstack.trainer._src.signals import STOP, Stopped  # noqa: E402

config = load_config(
    "test",
    [
        f"log.run_dir={run_dir}",
        f"train.steps={steps}",
        "data.num_shards=2",
        "checkpoint.every=4",
        "eval.every=0",
        "log.sample_tokens=0",
    ],
)


def report_step(step, state, metrics):
    print(f"STEP {step}", flush=True)


def signal_once_installed():
    while not STOP.installed:
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)


mode = sys.argv[5] if len(sys.argv) > 5 else None
if mode == "startup" and process_id == 1:
    threading.Thread(target=signal_once_installed, daemon=True).start()
try:
    result = train(config, callbacks=[report_step] if mode else [])
except Stopped as e:
    print(f"PROCESS {process_id} STOPPED by {e} during start-up", flush=True)
    jax.distributed.shutdown()
    sys.exit(128 + e.signum)
jax.distributed.shutdown()
if result.stopped:
    print(f"PROCESS {process_id} STOPPED by {result.stopped} at step {result.step}", flush=True)
    sys.exit(128 + result.stop_signal)
print(f"PROCESS {process_id} DONE step {result.step} eval {result.eval['eval_loss']:.6f}")
