"""One of two JAX processes of the multi-host test (2 CPU devices each, gloo collectives).

Usage: python ckptlib_multihost_worker.py PROCESS_ID PORT DIRECTORY RESULT_JSON
"""

import json
import os
import sys


def main(process_id: int, port: int, directory: str, result_path: str) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxstack.ckptlib import CheckpointManager

    full = global_values()
    mesh = jax.make_mesh((4,), ("data",))
    w = jax.make_array_from_callback(full.shape, NamedSharding(mesh, P("data")), lambda i: full[i])
    result = {"process_count": jax.process_count()}
    with CheckpointManager(directory, max_to_keep=1) as mgr:
        for step in (1, 2):
            state = {"params": {"w": w * step}, "step": step}
            mgr.save(step, state, data_state={"process": process_id, "step": step})
        mgr.wait()
        result["all_steps"] = mgr.all_steps()
        # Restore onto another layout: columns instead of rows.
        columns = NamedSharding(mesh, P(None, "data"))
        target = {
            "params": {"w": jax.ShapeDtypeStruct(full.shape, np.float32, sharding=columns)},
            "step": 0,
        }
        restored = mgr.restore(target=target)
        shards = restored.state["params"]["w"].addressable_shards
        result["restored_step"] = restored.step
        result["data_state"] = restored.data_state
        result["shards_match"] = all(
            np.array_equal(np.asarray(s.data), (full * 2)[s.index]) for s in shards
        )
        result["shard_shapes"] = [list(s.data.shape) for s in shards]
    with open(result_path, "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


def global_values():
    import numpy as np

    return np.arange(16 * 8, dtype=np.float32).reshape(16, 8)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
