"""Facts about the workspace's packages, read from their pyproject files.

The noxfile and the release checks share these so that the list of packages, their versions and
their sibling dependencies live in one place: the packages' own `pyproject.toml` files.
"""

from __future__ import annotations

import datetime
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
    test_dependencies: tuple[str, ...] = ()
    extra_dependencies: tuple[str, ...] = ()  # every extra's requirements, `test` included

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
        return siblings_in(self.dependencies)

    @property
    def sibling_test_dependencies(self) -> tuple[str, ...]:
        """Folders of the jaxstack packages its `test` extra adds (optional integrations)."""
        return siblings_in(self.test_dependencies)


def siblings_in(requirements: tuple[str, ...]) -> tuple[str, ...]:
    names = (requirement_name(r) for r in requirements)
    return tuple(
        n.removeprefix(DISTRIBUTION_PREFIX) for n in names if n.startswith(DISTRIBUTION_PREFIX)
    )


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def load_package(folder: str) -> Package:
    project = tomllib.loads((PACKAGES_DIR / folder / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return Package(
        folder,
        project["name"],
        project["version"],
        tuple(project.get("dependencies", ())),
        tuple(extras),
        tuple(extras.get("test", ())),
        tuple(r for requirements in extras.values() for r in requirements),
    )


def all_packages() -> list[Package]:
    return [
        load_package(p.name)
        for p in sorted(PACKAGES_DIR.iterdir())
        if (p / "pyproject.toml").exists()
    ]


def closure(folder: str, *, with_test_extra: bool = False) -> list[Package]:
    """The package and every sibling it needs, transitively, dependencies first.

    With `with_test_extra`, also the siblings the package's own `test` extra names (the optional
    integrations its tests exercise), which must come from their folders too.
    """
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

    if with_test_extra:
        for sibling in load_package(folder).sibling_test_dependencies:
            visit(sibling)
    visit(folder)
    return ordered


@dataclass(frozen=True)
class Heading:
    """A `## ` heading of a CHANGELOG: `## Unreleased` (version None), `## [V]` (not released yet,
    no date) or `## [V] - YYYY-MM-DD` (released on that date); `line` is the heading as written."""

    line: str
    version: str | None
    date: datetime.date | None


HEADING = re.compile(
    r"## (?:\[?Unreleased\]?|\[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?)\s*"
)


def changelog_headings(package: Package) -> list[Heading]:
    """The CHANGELOG's `## ` headings, top first. A heading of another form raises ValueError."""
    found = []
    for line in (package.path / "CHANGELOG.md").read_text().splitlines():
        if not line.startswith("## "):
            continue
        if not (match := HEADING.fullmatch(line)):
            raise ValueError(
                f"packages/{package.folder}/CHANGELOG.md: heading {line!r} is none of "
                "'## Unreleased', '## [V]', '## [V] - YYYY-MM-DD'."
            )
        date = match["date"] and datetime.date.fromisoformat(match["date"])
        found.append(Heading(line, match["version"], date))
    return found
