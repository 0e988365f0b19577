"""Puts this folder on sys.path (pytest runs with --import-mode=importlib) for optlib_testing."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from optlib_testing import make_params


@pytest.fixture
def params():
    return make_params()
