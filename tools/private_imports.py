"""Tests and benchmarks use other packages only through their public names.

import-linter checks the packages' own sources (the `private_modules` contract in the root
pyproject.toml); test and benchmark folders are not importable packages, so this walks their
imports instead. A package's own tests may reach into its `_src`; nothing else may.

    python tools/private_imports.py      # exit status 1 and one line per private import found
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import workspace

CHECKED = ("integration_tests", "benchmarks", "packages/*/tests")


def imported_modules(source: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def private_owner(module: str) -> str | None:
    """The package (import name) whose private module `module` is, if it is one."""
    parts = module.split(".")
    if parts[0] != "jaxstack" or len(parts) < 3:
        return None
    return (
        parts[1] if any(p.startswith("_") and not p.startswith("__") for p in parts[2:]) else None
    )


def own_package(path: Path, root: Path) -> str | None:
    """Import name of the package whose tests hold `path`, if they do."""
    relative = path.relative_to(root).parts
    if relative[0] == "packages" and len(relative) > 2 and relative[2] == "tests":
        return relative[1].replace("-", "_")
    return None


def violations(root: Path) -> list[str]:
    found = []
    for pattern in CHECKED:
        for folder in sorted(root.glob(pattern)):
            for path in sorted(folder.rglob("*.py")):
                allowed = own_package(path, root)
                for line, module in imported_modules(path.read_text()):
                    owner = private_owner(module)
                    if owner is not None and owner != allowed:
                        found.append(
                            f"{path.relative_to(root)}:{line}: imports {module}, a private module "
                            f"of jaxstack.{owner}; use a name from jaxstack.{owner}.__all__"
                        )
    return sorted(set(found))


def main() -> int:
    found = violations(workspace.ROOT)
    print("\n".join(found) or "private imports: none outside their own package's tests")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
