"""docs/conventions.md stays true: its Python blocks run, and the packages' real functions do what
the page says (paths, batch, model call, attention signature, training state, quantised tensor,
metrics)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxstack import ckptlib, datalib, kernlib, nnlib, optlib

DOC = Path(__file__).resolve().parents[1] / "docs" / "conventions.md"
TEXT = DOC.read_text()
CONFIG = nnlib.get_preset("tiny").replace(
    vocab_size=259, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
    mlp_dim=32, max_seq_len=32,
)  # fmt: skip


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", TEXT, re.M | re.S)
    assert match, f"docs/conventions.md has no '## {title}' section"
    return match.group(1)


@pytest.fixture(scope="module")
def doc_namespace() -> dict:
    """Every Python block of the page, run in order in one namespace."""
    blocks = re.findall(r"```python\n(.*?)```", TEXT, re.S)
    assert len(blocks) >= 6
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    return namespace


def test_the_documented_path_function_is_the_packages_one(doc_namespace):
    leaf_path = doc_namespace["leaf_path"]
    params = nnx.state(nnlib.Transformer(CONFIG, rngs=nnx.Rngs(0)), nnx.Param)
    opt_state = optlib.build_optimizer(
        optlib.OptimizerConfig.from_dict({"name": "adamw", "learning_rate": 1e-3}), params
    ).init(params)
    for tree in (params, opt_state):
        documented = [leaf_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
        assert documented == jax.tree.leaves(optlib.param_paths(tree))
    assert "layers/1/attn/q_proj/kernel" in jax.tree.leaves(optlib.param_paths(params))


def documented_batch_table() -> dict[str, tuple[str, str]]:
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (\[[^\]]*\]) \|", section("Batch"), re.M)
    return {key: (dtype, shape) for key, dtype, shape in rows}


def test_datalib_batches_are_the_documented_batch():
    table = documented_batch_table()
    assert set(table) == {"tokens", "targets", "segment_ids", "positions", "loss_mask"}
    documents = [f"def f{i}():\n    return {i}\n" * (1 + i % 3) for i in range(40)]
    batches = datalib.lm_batches(
        datalib.InMemorySource(documents), datalib.ByteTokenizer(), seq_len=32, batch_size=4
    )
    batch = next(iter(batches))
    assert set(batch) == set(table)
    for key, (dtype, shape) in table.items():
        assert batch[key].dtype == np.dtype(dtype), key
        assert shape == "[B, T]" and batch[key].shape == (4, 32), key
    segments, positions, mask = batch["segment_ids"], batch["positions"], batch["loss_mask"]
    assert (mask[segments == 0] == 0).all()  # padding carries no loss
    starts = np.diff(segments, axis=1, prepend=0) != 0
    assert (positions[starts & (segments > 0)] == 0).all()  # each document counts from 0
    follows = (mask[:, :-1] == 1) & (segments[:, :-1] == segments[:, 1:])
    assert (batch["targets"][:, :-1][follows] == batch["tokens"][:, 1:][follows]).all()


def test_nnlib_model_call_is_the_documented_signature():
    assert "model(tokens, positions, segment_ids=None, cache=None) -> (logits, cache)" in TEXT
    model = nnlib.Transformer(CONFIG, rngs=nnx.Rngs(0))
    parameters = list(inspect.signature(model.__call__).parameters)
    assert parameters[:4] == ["tokens", "positions", "segment_ids", "cache"]
    tokens = np.ones((2, 8), np.int32)
    positions = np.broadcast_to(np.arange(8, dtype=np.int32), (2, 8))
    logits, cache = model(tokens, positions, segment_ids=np.ones((2, 8), np.int32))
    assert logits.shape == (2, 8, CONFIG.vocab_size) and cache is None


@pytest.mark.parametrize("attention", [kernlib.attention, nnlib.dot_product_attention])
def test_attention_functions_take_the_documented_keywords(attention):
    documented = re.search(r"attention_fn\((.*?)\) ->", TEXT, re.S).group(1)
    names = [n.strip().split("=")[0] for n in documented.replace("*,", "").split(",")]
    parameters = inspect.signature(attention).parameters
    assert [n for n in names if n] and all(n in parameters for n in names if n), names


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory) -> Path:
    trainer = pytest.importorskip("jaxstack.trainer")
    run_dir = tmp_path_factory.mktemp("run")
    overrides = [f"log.run_dir={run_dir}", "train.steps=3", "checkpoint.every=3", "eval.every=3"]
    trainer.train(trainer.load_config("test", [*overrides, "log.sample_tokens=0"]))
    return run_dir


def test_a_trainer_checkpoint_holds_the_documented_training_state(trainer_run):
    with ckptlib.CheckpointManager(trainer_run / "checkpoints", read_only=True) as manager:
        restored = manager.restore()
    assert set(restored.state) == {"params", "opt_state", "step"}
    assert int(restored.state["step"]) == 3
    assert json.loads(json.dumps(restored.data_state)) == restored.data_state
    assert {"config", "versions"} <= set(restored.metadata)
    assert "jaxstack-trainer" in restored.metadata["versions"]


def test_trainer_metrics_are_documented_json_lines(trainer_run):
    records = [
        json.loads(line) for line in (trainer_run / "metrics.jsonl").read_text().splitlines()
    ]
    assert {r["kind"] for r in records} >= {"train", "eval"}
    for record in records:
        assert isinstance(record["step"], int)
        assert not any(isinstance(v, dict | list) for v in record.values()), record
        if record["kind"] != "summary":
            numbers = {k: v for k, v in record.items() if k != "kind"}
            assert all(isinstance(v, int | float) for v in numbers.values()), record
    train = [r for r in records if r["kind"] == "train"]
    assert {"loss", "learning_rate", "grad_norm", "tokens_per_sec", "mfu"} <= set(train[0])


def test_quantlib_tensor_is_the_documented_structure_and_kernlib_reads_it():
    quantlib = pytest.importorskip("jaxstack.quantlib")
    if not hasattr(quantlib, "quantize_tensor"):
        pytest.skip("quantlib has not landed quantize_tensor yet")
    w = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(8, 8)
    q = quantlib.quantize_tensor(w, "int8")
    for attribute in ("values", "scales", "zero_points", "dtype", "shape"):
        assert hasattr(q, attribute), attribute
    assert q.values.dtype == np.int8 and tuple(q.shape) == w.shape and q.dtype == w.dtype
    leaves = jax.tree.leaves(q)
    assert any(leaf is q.values for leaf in leaves)  # a registered PyTree node, not a leaf
    x = np.eye(8, dtype=np.float32)
    np.testing.assert_allclose(kernlib.quantized_matmul(x, q), w, atol=float(np.max(q.scales)))
