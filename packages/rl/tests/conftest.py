import json

import pytest

TINY = [
    "model.preset=tiny-llama",
    "model.d_model=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "model.head_dim=16",
    "model.mlp_dim=64",
    "log.tensorboard=false",
    "log.report=false",
    "log.progress=plain",
]


@pytest.fixture
def write_jsonl():
    """`write_jsonl(path, records) -> path`: one JSON object per line."""

    def write(path, records):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    return write


@pytest.fixture
def tiny():
    return list(TINY)
