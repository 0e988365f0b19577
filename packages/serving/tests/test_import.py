import importlib.metadata
import pathlib
import re

import jaxstack.serving


def test_public_api_names_exist():
    for name in jaxstack.serving.__all__:
        assert hasattr(jaxstack.serving, name), name


def test_installed_version_is_the_changelog_top_entry():
    changelog = pathlib.Path(__file__).parents[1] / "CHANGELOG.md"
    top = re.search(r"^## \[([^\]]+)\]", changelog.read_text(), re.M).group(1)
    assert importlib.metadata.version("jaxstack-serving") == top
