import os

import pytest


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    """A private tuning cache, so tests never read or write the real user cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv("JAXSTACK_KERNLIB_CACHE_DIR", str(path))
    return path / "autotune.json"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    if "JAXSTACK_KERNLIB_CACHE_DIR" not in os.environ:
        path = tmp_path_factory.mktemp("kernlib-cache")
        monkeypatch.setenv("JAXSTACK_KERNLIB_CACHE_DIR", str(path))
