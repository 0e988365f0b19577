import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from nnlib_testutil import batch, forward, make, max_diff

from jaxstack import nnlib


def perturb(model, seed=0):
    """Give the (zero-initialised) b matrices random values so adapters change the output."""
    state = nnlib.lora_state(model)
    keys = iter(jax.random.split(jax.random.key(seed), 100))
    state = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), state)
    nnx.update(model, state)


@pytest.mark.parametrize("scan", [pytest.param(False, marks=pytest.mark.slow), True])
def test_lora_starts_neutral_then_merge_and_unmerge(tmp_path, scan):
    model = make(scan_layers=scan)
    tokens, positions = batch()
    base, _ = forward(model, tokens, positions)
    paths = nnlib.apply_lora(model, r"attn/(q|v)_proj$", rank=4, alpha=8)
    assert len(paths) == (2 if scan else 4)
    assert max_diff(forward(model, tokens, positions)[0], base) == 0.0  # b starts at zero
    perturb(model)
    adapted, _ = forward(model, tokens, positions)
    assert max_diff(adapted, base) > 1e-3
    nnlib.save_lora(model, tmp_path / "adapter.safetensors")
    nnlib.merge_lora(model)
    assert not jax.tree.leaves(nnlib.lora_state(model))
    assert max_diff(forward(model, tokens, positions)[0], adapted) < 1e-5
    nnlib.unmerge_lora(model, tmp_path / "adapter.safetensors")
    assert max_diff(forward(model, tokens, positions)[0], adapted) < 1e-5
    nnlib.merge_lora(model)
    nnlib.unmerge_lora(model, tmp_path / "adapter.safetensors")
    nnlib.set_lora_dropout_rng(model, None)
    state = nnlib.lora_state(model)
    nnx.update(model, jax.tree.map(jnp.zeros_like, state))
    assert max_diff(forward(model, tokens, positions)[0], base) < 1e-5


def test_adapters_load_into_a_fresh_model(tmp_path):
    model = make()
    nnlib.apply_lora(model, r"mlp/(gate|up)_proj$", rank=2, alpha=4, dropout=0.1)
    perturb(model, 1)
    nnlib.save_lora(model, tmp_path / "a.safetensors")
    fresh = make()
    assert nnlib.load_lora(fresh, tmp_path / "a.safetensors") == [
        "layers/0/mlp/gate_proj",
        "layers/0/mlp/up_proj",
        "layers/1/mlp/gate_proj",
        "layers/1/mlp/up_proj",
    ]
    tokens, positions = batch()
    assert (
        max_diff(forward(fresh, tokens, positions)[0], forward(model, tokens, positions)[0]) == 0.0
    )
    assert fresh.layers[0].mlp.gate_proj.lora.rate == 0.1


def test_lora_only_training_and_dropout_key():
    model = make()
    nnlib.apply_lora(model, r"q_proj$", rank=2, dropout=0.5)
    apply, lora = nnlib.as_function(model, wrt=nnx.LoRAParam)
    tokens, positions = batch()
    perturbed = jax.tree.map(lambda x: x + 0.1, lora)
    f = jax.jit(lambda p, key: apply(p, tokens, positions, dropout_rng=key)[0])
    a, b = f(perturbed, jax.random.key(0)), f(perturbed, jax.random.key(1))
    assert max_diff(a, b) > 0  # dropout active with a key
    g = jax.jit(lambda p: apply(p, tokens, positions)[0])
    assert max_diff(g(perturbed), g(perturbed)) == 0.0  # and off without one


def test_errors_name_the_pattern():
    model = make()
    with pytest.raises(nnlib.SurgeryError, match=r"pattern 'nope' matched no Dense"):
        nnlib.apply_lora(model, "nope", rank=2)
    with pytest.raises(nnlib.SurgeryError, match="no LoRA adapters"):
        nnlib.save_lora(model, "/tmp/x.safetensors")


def test_export_merges_adapters(tmp_path):
    model = make()
    nnlib.apply_lora(model, r"o_proj$", rank=2)
    perturb(model)
    tokens, positions = batch()
    want, _ = forward(model, tokens, positions)
    out = nnlib.save_hf_checkpoint(model, tmp_path / "hf")
    again = nnlib.load_hf_checkpoint(out)
    assert max_diff(forward(again, tokens, positions)[0], want) < 1e-5
    assert np.isfinite(np.asarray(want)).all()
