"""The import contracts really bite: a forbidden import in a copy of the sources breaks them."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from workspace import all_packages  # noqa: E402


def copy_sources(destination: Path) -> list[Path]:
    """Copy every package's src/ into destination, returning the new src folders."""
    sources = []
    for package in all_packages():
        target = destination / package.folder / "src"
        shutil.copytree(package.path / "src", target, ignore=shutil.ignore_patterns("__pycache__"))
        sources.append(target)
    return sources


def lint_imports(sources: list[Path]) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": ":".join(map(str, sources)), "PATH": str(Path(sys.executable).parent)}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--no-cache",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def inject(sources_root: Path, package: str, line: str) -> None:
    init = sources_root / package / "src" / "jaxstack" / package.replace("-", "_") / "__init__.py"
    init.write_text(init.read_text() + f"\n{line}\n")


def test_main_sources_keep_the_contract(tmp_path):
    result = lint_imports(copy_sources(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("package", "line", "contract"),
    [
        ("nnlib", "import jaxstack.optlib", "Layers"),
        ("quantlib", "import jaxstack.trainer", "Layers"),
        ("trainer", "import jaxstack.serving", "Layers"),
        ("datalib", "import jax", "datalib does not import JAX"),
        ("trainer", "from jaxstack.nnlib._src import paths", "private modules"),
        ("rl", "import jaxstack.serving._src", "private modules"),
    ],
)
def test_forbidden_import_breaks_the_contract(tmp_path, package, line, contract):
    sources = copy_sources(tmp_path)
    inject(tmp_path, package, line)
    result = lint_imports(sources)
    assert result.returncode != 0
    assert f"{contract}" in result.stdout and "BROKEN" in result.stdout, result.stdout
