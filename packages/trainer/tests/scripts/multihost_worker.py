"""One process of a 2-process CPU run: argv = process_id, port, run_dir, steps[, term_at].

With `term_at`, process 1 alone sends itself SIGTERM after that step (a preemption notice that
reaches one host of a job first)."""

import os
import signal
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, run_dir, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

from jaxstack.trainer import load_config, train  # noqa: E402

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
term_at = int(sys.argv[5]) if len(sys.argv) > 5 else None


def preempt_process_1(step, state, metrics):
    if process_id == 1 and step == term_at:
        os.kill(os.getpid(), signal.SIGTERM)


result = train(config, callbacks=[preempt_process_1])
if result.stopped:
    print(f"PROCESS {process_id} STOPPED by {result.stopped} at step {result.step}")
else:
    print(f"PROCESS {process_id} DONE step {result.step} eval {result.eval['eval_loss']:.6f}")
jax.distributed.shutdown()
