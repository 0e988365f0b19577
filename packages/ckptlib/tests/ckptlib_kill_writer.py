"""Writer process of the SIGKILL reliability test: saves step after step until it is killed.

Usage: python ckptlib_kill_writer.py DIRECTORY
Prints "saving N" before each save and "committed N" once step N is known to be committed.
"""

import os
import sys

import numpy as np


def state_for(step: int) -> dict:
    """The exact state saved at `step` (so the test can check restores bit for bit)."""
    rng = np.random.default_rng(step)
    return {
        "params": {
            "w": rng.standard_normal((512, 512), dtype=np.float32),
            "b": rng.standard_normal(512, dtype=np.float32),
        },
        "opt_state": [{"mu": rng.standard_normal((512, 512), dtype=np.float32)}, None],
        "step": step,
    }


def main(directory: str) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from jaxstack.ckptlib import CheckpointManager

    mgr = CheckpointManager(directory, max_to_keep=2)
    step = (mgr.latest_step() or 0) + 1
    while True:
        print(f"saving {step}", flush=True)
        state = state_for(step)
        state["params"] = jax.tree.map(jax.numpy.asarray, state["params"])
        mgr.save(step, state, data_state={"next_step": step + 1})
        if step % 3 == 0:
            mgr.wait()
            print(f"committed {step}", flush=True)
        elif step > 1:
            print(f"committed {step - 1}", flush=True)  # save() waited for it
        step += 1


if __name__ == "__main__":
    main(sys.argv[1])
