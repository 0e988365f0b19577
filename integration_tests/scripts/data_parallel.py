"""A data-parallel training run of the stack's packages, as one process of `count` (argv).

    data_parallel.py OUT PROCESS_ID COUNT PORT      # jax.distributed over gloo on 127.0.0.1
    data_parallel.py OUT 0 1 0                      # one process holding COUNT=2 CPU devices

Each process reads its own shard of the data (datalib), the shards form one global batch, an
nnlib model trains on it with an optlib optimiser, and the state is checkpointed with ckptlib
from every process. Process 0 writes the losses to OUT/losses.json.
"""

import json
import sys
from pathlib import Path

import jax

out, process_id, count, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if count > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=process_id)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from jaxstack import ckptlib, datalib, nnlib, optlib  # noqa: E402

SHARDS, LOCAL_BATCH, SEQ, STEPS = 2, 2, 32, 4
DOCUMENTS = [f"def f{i}(x):\n    return x * {i}\n" * (1 + i % 4) for i in range(64)]

tokenizer = datalib.ByteTokenizer()
config = nnlib.get_preset("tiny").replace(
    vocab_size=tokenizer.vocab_size, d_model=32, num_layers=2, num_heads=2, num_kv_heads=2,
    head_dim=16, mlp_dim=64, max_seq_len=SEQ,
)  # fmt: skip
apply, params = nnlib.as_function(nnlib.Transformer(config, rngs=nnx.Rngs(0)))
tx = optlib.build_optimizer(
    optlib.OptimizerConfig.from_dict({"name": "adamw", "learning_rate": 3e-3}), params
)
mesh = jax.make_mesh((SHARDS,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
replicated, by_row = (
    NamedSharding(mesh, PartitionSpec()),
    NamedSharding(mesh, PartitionSpec("data")),
)


def shard_batches(index: int):
    return iter(
        datalib.lm_batches(
            datalib.InMemorySource(DOCUMENTS), tokenizer, seq_len=SEQ, batch_size=LOCAL_BATCH,
            seed=1, shard_index=index, shard_count=SHARDS,
        )
    )  # fmt: skip


def global_batch(local_iterators) -> dict:
    """This process's shards as rows of the one global batch."""
    locals_ = [next(it) for it in local_iterators]
    local = {k: np.concatenate([b[k] for b in locals_]) for k in locals_[0]}
    return {
        k: jax.make_array_from_process_local_data(by_row, v, (SHARDS * LOCAL_BATCH, SEQ))
        for k, v in local.items()
    }


@jax.jit
def train_step(state, batch):
    def loss_fn(params):
        logits, _ = apply(params, batch["tokens"], batch["positions"], batch["segment_ids"])
        return optlib.cross_entropy_loss(logits, batch["targets"], batch["loss_mask"])[0]

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, loss


# one process reads both shards; each of two processes reads its own
mine = [shard_batches(i) for i in range(SHARDS)] if count == 1 else [shard_batches(process_id)]
state = jax.device_put(
    {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}, replicated
)
losses = []
for _ in range(STEPS):
    state, loss = train_step(state, global_batch(mine))
    losses.append(float(loss))
with ckptlib.CheckpointManager(out / "checkpoints") as manager:
    manager.save(STEPS, state, metadata={"processes": count})
    manager.wait()
if process_id == 0:
    (out / "losses.json").write_text(json.dumps(losses))
print(f"process {process_id}/{count} done: losses {losses}", flush=True)
