"""docs/architecture.md's dependency table says what the packages' pyproject files say."""

import re
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workspace import ROOT, all_packages, requirement_name

DOC = ROOT / "docs" / "architecture.md"


def names(requirements) -> str:
    return ", ".join(requirement_name(r) for r in requirements) or "-"


def declared_row(package) -> str:
    project = tomllib.loads((package.path / "pyproject.toml").read_text())["project"]
    siblings = [r for r in package.dependencies if requirement_name(r).startswith("jaxstack-")]
    others = [r for r in package.dependencies if r not in siblings]
    extras = "; ".join(
        f"`{name}`: {names(requirements)}"
        for name, requirements in project.get("optional-dependencies", {}).items()
        if name != "test"
    )
    sibling_names = names(siblings).replace("jaxstack-", "")
    return f"| {package.folder} | {sibling_names} | {names(others)} | {extras or '-'} |"


def documented_rows() -> dict[str, str]:
    table = DOC.read_text().split("## Declared dependencies", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([a-z-]+) \|.*\|$", table, re.M)
    lines = re.findall(r"^\| [a-z-]+ \|.*\|$", table, re.M)
    return dict(zip(rows, lines, strict=True))


def test_every_package_has_its_row_as_declared():
    documented = documented_rows()
    expected = {p.folder: declared_row(p) for p in all_packages()}
    assert set(documented) - {"package"} == set(expected)
    wrong = [row for folder, row in expected.items() if documented[folder] != row]
    assert not wrong, "docs/architecture.md should read:\n" + "\n".join(wrong)


def test_the_install_size_table_has_a_row_per_package():
    # The numbers are measured (tools/install_sizes.py --write), so only the rows are checked.
    table = DOC.read_text().split("<!-- install-sizes:start -->", 1)[1].split("<!-- install")[0]
    rows = re.findall(r"^\| ([a-z-]+) \| \d+ \| \d+ \| [\d.]+ \| .+ \|$", table, re.M)
    assert rows == [p.folder for p in all_packages()], (
        "docs/architecture.md's install-size table should have one row per package; "
        "rerun `.venv/bin/python tools/install_sizes.py --write`"
    )
