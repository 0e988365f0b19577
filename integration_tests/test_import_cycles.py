"""No package's modules import each other in a circle.

A circle makes import order matter (the first module to load sees the other half-built) and is
usually worked around with an import inside a function; import-linter's layer contracts do not
see circles inside one package, so this test walks each package's import graph (grimp, the
graph import-linter builds) and names every pair of modules that reach each other.
"""

from __future__ import annotations

import grimp
import pytest

PACKAGES = [
    "nnlib", "optlib", "ckptlib", "datalib", "kernlib", "quantlib", "trainer", "rl", "serving",
    "xprof_lite",
]  # fmt: skip


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package):
    graph = grimp.build_graph(f"jaxstack.{package}", include_external_packages=False)
    circles = sorted(
        (a, b)
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if a < b and graph.chain_exists(importer=b, imported=a)
    )
    assert not circles, f"modules that import each other (directly or through others): {circles}"
