import jax
from flax import nnx
from nnlib_testutil import batch, forward, make, max_diff

from jaxstack import nnlib


def test_freeze_removes_params_from_training_but_not_the_forward():
    model = make()
    tokens, positions = batch()
    want, _ = forward(model, tokens, positions)
    frozen = nnlib.freeze(model, r"^(embed|layers/0/)")
    assert "embed" in frozen and "layers/0/attn/q_proj/kernel" in frozen
    _, params = nnlib.as_function(model)
    paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(params)}
    assert "embed" not in paths and not any(p.startswith("layers/0/") for p in paths)
    assert "layers/1/attn/q_proj/kernel" in paths
    assert max_diff(forward(model, tokens, positions)[0], want) == 0.0
    assert set(nnlib.unfreeze(model)) == set(frozen)
    assert len(jax.tree.leaves(nnlib.as_function(model)[1])) == len(
        jax.tree.leaves(nnx.state(make(), nnx.Param))
    )


def test_replace_module_swaps_matching_submodules():
    model = make()
    tokens, positions = batch()

    class Doubled(nnx.Module):
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, x):
            return 2.0 * self.inner(x)

    before, _ = forward(model, tokens, positions)
    replaced = nnlib.replace_module(model, r"^layers/\d+/mlp$", lambda path, m: Doubled(m))
    assert replaced == ["layers/0/mlp", "layers/1/mlp"]
    assert isinstance(model.layers[1].mlp, Doubled)
    assert max_diff(forward(model, tokens, positions)[0], before) > 1e-4
    assert "layers/0/mlp/inner/up_proj" in dict(nnlib.iter_modules(model))


def test_init_from_copies_matching_params_only():
    target, source = make(seed=1), make(seed=2)
    copied = nnlib.init_from(target, source, r"^layers/0/")
    assert copied and all(p.startswith("layers/0/") for p in copied)
    t, s = nnx.state(target, nnx.Param), nnx.state(source, nnx.Param)
    assert (
        max_diff(
            t["layers"][0]["attn"]["q_proj"]["kernel"][...],
            s["layers"][0]["attn"]["q_proj"]["kernel"][...],
        )
        == 0
    )
    assert (
        max_diff(
            t["layers"][1]["attn"]["q_proj"]["kernel"][...],
            s["layers"][1]["attn"]["q_proj"]["kernel"][...],
        )
        > 0
    )
    flat = {"embed": s["embed"][...]}
    assert nnlib.init_from(target, flat) == ["embed"]
    bad = make(vocab_size=50)
    try:
        nnlib.init_from(target, bad, "^embed$")
    except nnlib.SurgeryError as e:
        assert "'embed' has shape (50, 32)" in str(e)
    else:
        raise AssertionError("expected SurgeryError")
