"""Tests and benchmarks reach other packages only through public names; a package's own tests
may use its private modules."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import private_imports
import workspace


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_workspace_has_none():
    assert private_imports.violations(workspace.ROOT) == []


def test_private_imports_outside_the_owner_are_found(tmp_path):
    write(
        tmp_path,
        "packages/xprof-lite/tests/test_a.py",
        "from jaxstack.xprof_lite._src import hlo\n",
    )
    write(tmp_path, "packages/trainer/tests/test_b.py", "import jaxstack.nnlib._src.paths\n")
    write(tmp_path, "benchmarks/kernels/run.py", "from jaxstack.kernlib import _src\n")
    write(tmp_path, "integration_tests/test_c.py", "from jaxstack.serving import export\n")
    found = private_imports.violations(tmp_path)
    assert [line.split(": ")[0] for line in found] == [
        "benchmarks/kernels/run.py:1",
        "packages/trainer/tests/test_b.py:1",
    ]
    assert "jaxstack.nnlib._src.paths, a private module of jaxstack.nnlib" in found[1]
