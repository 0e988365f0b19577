"""datalib -> nnlib -> optlib: the conventions carry a real batch through a real model and loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxstack import datalib, nnlib, optlib

SEQ_LEN = 64
BATCH = 4


def tiny_model(tokenizer) -> nnlib.Transformer:
    config = nnlib.get_preset("tiny-llama").replace(
        vocab_size=tokenizer.vocab_size, max_seq_len=SEQ_LEN
    )
    return nnlib.Transformer(config, rngs=nnx.Rngs(0))


def first_batch(tokenizer, source=None):
    source = datalib.default_corpus("train") if source is None else source
    batches = datalib.lm_batches(source, tokenizer, seq_len=SEQ_LEN, batch_size=BATCH, seed=0)
    return next(iter(batches))


SHORT_DOCUMENTS = [f"def f{i}(x):\n    return x * {i}\n" for i in range(40)]


def test_batch_from_datalib_matches_the_conventions():
    batch = first_batch(datalib.ByteTokenizer())
    assert set(batch) >= {"tokens", "targets", "segment_ids", "positions", "loss_mask"}
    for key in ("tokens", "targets", "segment_ids", "positions"):
        assert batch[key].dtype == np.int32 and batch[key].shape == (BATCH, SEQ_LEN), key
    assert batch["loss_mask"].shape == (BATCH, SEQ_LEN)
    same_doc = batch["segment_ids"][:, 1:] == batch["segment_ids"][:, :-1]
    # Within a document, the target of token t is token t+1.
    shifted = batch["targets"][:, :-1] == batch["tokens"][:, 1:]
    assert np.all(shifted[same_doc & (batch["loss_mask"][:, :-1] > 0)])


def test_packed_documents_do_not_see_each_other_through_the_model():
    tokenizer = datalib.ByteTokenizer()
    batch = first_batch(tokenizer, datalib.InMemorySource(SHORT_DOCUMENTS))
    model = tiny_model(tokenizer)
    apply, params = nnlib.as_function(model)
    row = int(np.argmax(batch["segment_ids"].max(axis=1)))  # the row with the most documents
    segments = batch["segment_ids"][row]
    assert segments.max() >= 2, "expected a packed row with at least two documents"
    last_doc = segments == segments.max()

    def logits_of(tokens):
        logits, _ = apply(
            params,
            jnp.asarray(tokens[None]),
            jnp.asarray(batch["positions"][row][None]),
            jnp.asarray(segments[None]),
        )
        return np.asarray(logits[0])

    original = logits_of(batch["tokens"][row])
    scrambled_tokens = batch["tokens"][row].copy()
    scrambled_tokens[~last_doc & (segments > 0)] = 7  # rewrite every other document
    changed = logits_of(scrambled_tokens)
    np.testing.assert_allclose(changed[last_doc], original[last_doc], atol=1e-5)


def test_a_few_adamw_steps_reduce_the_loss_on_the_default_corpus():
    tokenizer = datalib.ByteTokenizer()
    batch = {k: jnp.asarray(v) for k, v in first_batch(tokenizer).items()}
    model = tiny_model(tokenizer)
    apply, params = nnlib.as_function(model)
    config = optlib.OptimizerConfig.from_dict({"name": "adamw", "learning_rate": 3e-3})
    tx = optlib.build_optimizer(config, params)
    opt_state = tx.init(params)

    def loss_fn(params):
        logits, _ = apply(params, batch["tokens"], batch["positions"], batch["segment_ids"])
        loss, _ = optlib.cross_entropy_loss(logits, batch["targets"], batch["loss_mask"])
        return loss

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(12):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert losses[0] > np.log(tokenizer.vocab_size) * 0.8  # starts near uniform
    assert losses[-1] < losses[0] - 0.5
