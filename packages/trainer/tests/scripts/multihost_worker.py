"""One process of a 2-process CPU run: argv = process_id, port, run_dir, steps."""

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
result = train(config)
print(f"PROCESS {process_id} DONE step {result.step} eval {result.eval['eval_loss']:.6f}")
jax.distributed.shutdown()
