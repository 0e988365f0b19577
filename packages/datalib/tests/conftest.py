import json
import pathlib

import pytest

import jaxstack.datalib as dl


@pytest.fixture(scope="session")
def corpus():
    return dl.default_corpus("train")


@pytest.fixture
def jsonl_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "data.jsonl"
    rows = [{"text": f"document number {i} " * (i + 1), "id": i} for i in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path
