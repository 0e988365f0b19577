import importlib.metadata
import pathlib
import re

import jaxstack.xprof_lite


def test_public_api_names_exist():
    for name in jaxstack.xprof_lite.__all__:
        assert hasattr(jaxstack.xprof_lite, name), name


def test_installed_version_is_the_changelog_top_entry():
    changelog = pathlib.Path(__file__).parents[1] / "CHANGELOG.md"
    top = re.search(r"^## \[([^\]]+)\]", changelog.read_text(), re.M).group(1)
    assert importlib.metadata.version("jaxstack-xprof-lite") == top
