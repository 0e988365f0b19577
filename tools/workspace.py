"""Facts about the workspace's packages, read from their pyproject files.

The noxfile and the release checks share these so that the list of packages, their versions and
their sibling dependencies live in one place: the packages' own `pyproject.toml` files.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES_DIR = ROOT / "packages"
DISTRIBUTION_PREFIX = "jaxstack-"


@dataclass(frozen=True)
class Package:
    folder: str
    distribution: str
    version: str
    dependencies: tuple[str, ...]
    extras: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return PACKAGES_DIR / self.folder

    @property
    def test_requirement(self) -> str:
        """pip requirement for the package from its folder, with its `test` extra if it has one."""
        extra = "[test]" if "test" in self.extras else ""
        return f"{self.path}{extra}"

    @property
    def sibling_dependencies(self) -> tuple[str, ...]:
        """Folders of the jaxstack packages this one declares as dependencies."""
        names = (requirement_name(r) for r in self.dependencies)
        return tuple(
            n.removeprefix(DISTRIBUTION_PREFIX) for n in names if n.startswith(DISTRIBUTION_PREFIX)
        )


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def load_package(folder: str) -> Package:
    project = tomllib.loads((PACKAGES_DIR / folder / "pyproject.toml").read_text())["project"]
    return Package(
        folder,
        project["name"],
        project["version"],
        tuple(project.get("dependencies", ())),
        tuple(project.get("optional-dependencies", {})),
    )


def all_packages() -> list[Package]:
    return [
        load_package(p.name)
        for p in sorted(PACKAGES_DIR.iterdir())
        if (p / "pyproject.toml").exists()
    ]


def closure(folder: str) -> list[Package]:
    """The package and every sibling it needs, transitively, dependencies first."""
    ordered: list[Package] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        package = load_package(name)
        for sibling in package.sibling_dependencies:
            visit(sibling)
        ordered.append(package)

    visit(folder)
    return ordered


def changelog_top_version(package: Package) -> str | None:
    match = re.search(r"^## \[([^\]]+)\]", (package.path / "CHANGELOG.md").read_text(), re.M)
    return match.group(1) if match else None
