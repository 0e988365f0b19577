"""An nnlib model leaves the training world: exported and served by serving, and profiled by
xprof-lite with FLOPs that agree with nnlib's own count."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack import nnlib, serving, xprof_lite

CONFIG = nnlib.get_preset("tiny-llama").replace(max_seq_len=32)
SEQ = 32


def model_function():
    apply, params = nnlib.as_function(nnlib.Transformer(CONFIG, rngs=nnx.Rngs(0)))

    def next_token_logits(params, tokens):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        logits, _ = apply(params, tokens, positions)
        return logits[:, -1]

    return next_token_logits, params


def test_exported_nnlib_model_serves_the_same_logits(tmp_path):
    fn, params = model_function()
    example = np.zeros((1, SEQ), np.int32)
    directory = serving.export(fn, params, example, name="tiny", version=1, repository=tmp_path)
    artifact = serving.load_artifact(directory)
    tokens = np.random.default_rng(0).integers(0, 256, (3, SEQ), dtype=np.int32)
    [input_spec] = artifact.signature.inputs
    [served] = artifact.call_numpy({input_spec.name: tokens}).values()
    direct = jax.jit(fn)(params, jnp.asarray(tokens))
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-5)


def test_profiled_matmul_flops_agree_with_nnlib_flop_count():
    _, params = model_function()
    apply, _ = nnlib.as_function(nnlib.Transformer(CONFIG, rngs=nnx.Rngs(0)))
    tokens = jnp.zeros((4, SEQ), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(SEQ, dtype=jnp.int32), tokens.shape)

    def loss(params):
        logits, _ = apply(params, tokens, positions)
        return jnp.mean(logits)

    profile = xprof_lite.op_profile(jax.jit(jax.grad(loss)), params)
    measured = profile.total_flops
    expected = nnlib.training_flops_per_token(CONFIG, SEQ) * tokens.size
    assert abs(measured - expected) / expected < 0.15, (measured, expected)
