import json

import pytest

from jaxstack import kernlib
from jaxstack.kernlib._src import tuning


def test_user_entries_override_shipped_and_wildcards_apply(tmp_path):
    shipped = tmp_path / "shipped.json"
    shipped.write_text(
        json.dumps(
            {
                "format": tuning.FORMAT,
                "entries": {
                    "GPU X": {
                        "attention": {
                            "*": {"implementation": "pallas_triton", "config": {"a": 1}},
                            "spec1": {"implementation": "xla", "config": None},
                        }
                    }
                },
            }
        )
    )
    cache = tuning.TuningCache(user_path=tmp_path / "user.json", shipped_path=shipped)
    assert cache.lookup("GPU X", "attention", "spec1")["implementation"] == "xla"
    assert cache.lookup("GPU X", "attention", "other")["config"] == {"a": 1}
    assert cache.lookup("GPU Y", "attention", "spec1") is None
    cache.record("GPU X", "attention", "spec1", {"implementation": "pallas_triton", "config": {}})
    assert cache.lookup("GPU X", "attention", "spec1")["implementation"] == "pallas_triton"
    merged = cache.all_entries()["GPU X"]["attention"]
    assert set(merged) == {"*", "spec1"}


def test_record_is_atomic_and_keeps_other_entries(tmp_path):
    path = tmp_path / "d" / "autotune.json"
    cache = tuning.TuningCache(user_path=path, shipped_path=tmp_path / "none.json")
    cache.record("k", "rms_norm", "s1", {"implementation": "xla"})
    cache.record("k", "rms_norm", "s2", {"implementation": "xla"})
    data = json.loads(path.read_text())
    assert data["format"] == tuning.FORMAT and set(data["entries"]["k"]["rms_norm"]) == {"s1", "s2"}
    assert [p.name for p in path.parent.iterdir()] == ["autotune.json"]  # no temp files left


def test_malformed_cache_is_a_clear_error(tmp_path):
    bad = tmp_path / "autotune.json"
    bad.write_text("{not json")
    cache = tuning.TuningCache(user_path=bad, shipped_path=tmp_path / "none.json")
    with pytest.raises(kernlib.TuningCacheError, match="delete it"):
        cache.lookup("k", "attention", "s")
    bad.write_text(json.dumps({"format": "other/9", "entries": {}}))
    with pytest.raises(kernlib.TuningCacheError, match="expected"):
        cache.lookup("k", "attention", "s")


def test_shipped_defaults_file_is_valid():
    data = json.loads(tuning.SHIPPED_PATH.read_text())
    assert data["format"] == tuning.FORMAT and isinstance(data["entries"], dict)


def test_user_cache_path_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXSTACK_KERNLIB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernlib.user_cache_path() == tmp_path / "jaxstack" / "kernlib" / "autotune.json"
