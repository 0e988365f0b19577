"""Test setup: tests/ goes on sys.path for the shared helpers (kernlib_testutil: the tolerance
table; kernlib_lowering: lowering for devices this host lacks), which are not in the wheel."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


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
