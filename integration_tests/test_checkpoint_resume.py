"""ckptlib + datalib + nnlib + optlib: resuming from a checkpoint continues the run exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxstack import ckptlib, datalib, nnlib, optlib

DOCUMENTS = [f"class C{i}:\n    value = {i * 7}\n" * (1 + i % 3) for i in range(60)]
SEQ_LEN, BATCH, TOTAL, RESUME_AT = 32, 2, 6, 3


def setup():
    tokenizer = datalib.ByteTokenizer()
    config = nnlib.get_preset("tiny-llama").replace(
        vocab_size=tokenizer.vocab_size, max_seq_len=SEQ_LEN
    )
    apply, params = nnlib.as_function(nnlib.Transformer(config, rngs=nnx.Rngs(0)))
    tx = optlib.build_optimizer(
        optlib.OptimizerConfig.from_dict({"name": "adamw", "learning_rate": 1e-2}), params
    )

    @jax.jit
    def step(state, batch):
        def loss_fn(params):
            logits, _ = apply(params, batch["tokens"], batch["positions"], batch["segment_ids"])
            return optlib.cross_entropy_loss(logits, batch["targets"], batch["loss_mask"])[0]

        grads = jax.grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}

    batches = datalib.lm_batches(
        datalib.InMemorySource(DOCUMENTS), tokenizer, seq_len=SEQ_LEN, batch_size=BATCH, seed=3
    )
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
    return step, batches, state


def run(step, iterator, state, until):
    while int(state["step"]) < until:
        state = step(state, {k: jnp.asarray(v) for k, v in next(iterator).items()})
    return state


def test_resume_from_checkpoint_is_bitwise_identical(tmp_path):
    step, batches, state = setup()
    straight = run(step, iter(batches), state, TOTAL)

    step, batches, state = setup()
    iterator = iter(batches)
    state = run(step, iterator, state, RESUME_AT)
    with ckptlib.CheckpointManager(tmp_path / "ckpt") as manager:
        manager.save(RESUME_AT, state, data_state=iterator.get_state(), metadata={"run": "it"})
        manager.wait()

    step, batches, fresh = setup()
    with ckptlib.CheckpointManager(tmp_path / "ckpt") as manager:
        assert manager.latest_step() == RESUME_AT
        restored = manager.restore(target=fresh)
    assert restored.metadata["run"] == "it"
    iterator = iter(batches)
    iterator.set_state(restored.data_state)
    resumed = run(step, iterator, restored.state, TOTAL)

    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
