"""One parameter-path convention across the packages (docs/conventions.md): every package that
shows a leaf's path shows the same string for the same leaf.

The same three trees (an nnlib model state, the Optax state of that model, a plain dict with a
real key named "value") go through each package's public way of naming leaves: nnlib's
`param_path`, optlib's `param_paths`, the tensor names of ckptlib's `save_safetensors`, the
weight names of serving's exported artifact, and the module paths of nnlib's `iter_modules` and
quantlib's `match_rules`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from safetensors.numpy import load_file

from jaxstack import ckptlib, nnlib, optlib, serving

CONFIG = nnlib.get_preset("tiny").replace(
    vocab_size=64, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
    mlp_dim=32, max_seq_len=8,
)  # fmt: skip


def model() -> nnx.Module:
    return nnlib.Transformer(CONFIG, rngs=nnx.Rngs(0))


def trees() -> dict[str, object]:
    params = nnx.state(model(), nnx.Param)
    return {
        "nnlib state": params,
        "optax state": optax.adamw(1e-3).init(params),
        "plain dict": {
            "encoder": {"value": np.ones(2, np.float32), "blocks": [np.zeros(3, np.float32)]},
            "step": np.int32(7),
        },
    }


def nnlib_paths(tree) -> list[str]:
    return sorted(nnlib.param_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0])


def optlib_paths(tree) -> list[str]:
    return sorted(jax.tree.leaves(optlib.param_paths(tree)))


def ckptlib_paths(tree, tmp_path) -> list[str]:
    file = tmp_path / "tree.safetensors"
    names = ckptlib.save_safetensors(tree, file)
    assert sorted(names) == sorted(load_file(file))
    return sorted(names)


def serving_paths(tree, tmp_path) -> list[str]:
    def identity(weights, x):
        return x

    directory = serving.export(
        identity, tree, np.zeros((1, 2), np.float32), name="paths", version=1, repository=tmp_path
    )
    return sorted(load_file(directory / "weights.safetensors"))


@pytest.mark.parametrize("tree_name", ["nnlib state", "optax state", "plain dict"])
def test_every_package_names_every_leaf_the_same(tree_name, tmp_path):
    tree = trees()[tree_name]
    shown = {
        "optlib.param_paths": optlib_paths(tree),
        "nnlib.param_path": nnlib_paths(tree),
        "ckptlib.save_safetensors": ckptlib_paths(tree, tmp_path / "ckpt"),
        "serving.export": serving_paths(tree, tmp_path / "serving"),
    }
    reference = shown["optlib.param_paths"]
    assert len(reference) == len(jax.tree.leaves(tree))
    for package, paths in shown.items():
        assert paths == reference, f"{package} disagrees with optlib.param_paths on {tree_name}"


def test_the_documented_examples():
    shown = {name: set(optlib_paths(tree)) for name, tree in trees().items()}
    assert "layers/1/attn/q_proj/kernel" in shown["nnlib state"]
    assert "0/mu/layers/1/attn/q_proj/kernel" in shown["optax state"]
    # a dict key named "value" is a real name, not NNX's Variable wrapper
    assert shown["plain dict"] == {"encoder/value", "encoder/blocks/0", "step"}


def test_module_paths_are_the_leaf_paths_of_their_parameters():
    leaves = set(optlib_paths(nnx.state(model(), nnx.Param)))
    modules = {
        path for path, module in nnlib.iter_modules(model()) if isinstance(module, nnlib.Dense)
    }
    assert "layers/1/attn/q_proj" in modules
    assert {f"{path}/kernel" for path in modules} <= leaves


def test_quantlib_rules_select_modules_by_the_same_paths():
    quantlib = pytest.importorskip("jaxstack.quantlib", reason="quantlib not installed")
    if not hasattr(quantlib, "match_rules"):
        pytest.skip("quantlib has not landed its rules yet")
    leaves = set(optlib_paths(nnx.state(model(), nnx.Param)))
    matched = [path for path, _, _ in quantlib.match_rules(model(), quantlib.load_rules("int8"))]
    assert matched
    assert {f"{path}/kernel" for path in matched} <= leaves


def test_paths_survive_jit_boundaries():
    """The Optax state built inside jit names its leaves as the one built outside."""
    params = nnx.state(model(), nnx.Param)
    inside = jax.jit(optax.adamw(1e-3).init)(params)
    outside = optax.adamw(1e-3).init(jax.tree.map(jnp.asarray, params))
    assert optlib_paths(inside) == optlib_paths(outside)
