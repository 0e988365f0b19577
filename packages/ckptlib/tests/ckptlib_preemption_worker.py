"""One of two JAX processes of a training-like loop that a SIGTERM to one of them stops.

Usage: python ckptlib_preemption_worker.py PROCESS_ID PORT DIRECTORY

Each step adds 1 to a global array (one shard per process), prints `STEP n` and asks the
handler whether to stop; on the sync point it saves that step, prints `SAVED n` and exits with
the shell's status for the signal (143 for SIGTERM). Without a signal it runs ~forever.
"""

import os
import sys
import time


def main(process_id: int, port: int, directory: str) -> int:
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxstack.ckptlib import CheckpointManager, PreemptionHandler

    sharding = NamedSharding(jax.make_mesh((2,), ("data",)), P("data"))
    x = jax.make_array_from_process_local_data(sharding, np.zeros((4,), np.float32), (8,))
    add_one = jax.jit(lambda a: a + 1)
    status = 1
    with CheckpointManager(directory) as mgr, PreemptionHandler() as handler:
        for step in range(1, 100_000):
            x = add_one(x)
            print(f"STEP {step}", flush=True)
            if handler.reached_sync_point(step):
                mgr.save(step, {"x": x, "step": step})
                mgr.wait()
                print(f"SAVED {step}", flush=True)
                status = 128 + handler.received_signal
                break
            time.sleep(0.02)
    jax.distributed.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
