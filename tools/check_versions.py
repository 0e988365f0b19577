"""Release check: versions, CHANGELOGs, the README's package table and `releases.toml` agree.

For each package, with V the version in its `pyproject.toml`:

* V released (recorded in `releases.toml`): the CHANGELOG's top entry is `## [V] - <its date>`, and
  the package's shipped files (all but `tests/` and the CHANGELOG) are as in the release commit:
  a change needs a new version.
* V not released yet: V is newer than the package's last release and the CHANGELOG's top entry is
  `## Unreleased` (or `## [V]`, undated); `nox -s release -- <package>` dates it and records it.
* Every other CHANGELOG entry is a recorded release with its recorded date, and every recorded
  release has its entry.
* Every sibling requirement (dependencies and extras) is met by that sibling's last release: a
  package may only rely on what a user can install, which also keeps each `compat_release`
  session (one package at its release, the others at HEAD) resolvable.
* The README's package table gives V.

With `--since REV`, a package changed since REV must also have a version other than the one it
had at REV (useful in review).
"""

from __future__ import annotations

import argparse
import re
import sys

import releases
import workspace
from packaging.requirements import Requirement
from packaging.version import Version
from releases import Release
from workspace import Package, all_packages

UNSHIPPED = ("tests/", "CHANGELOG.md")


def changed_since(package: Package, rev: str) -> list[str]:
    """Files of the package that differ between `rev` and the working tree (new files not yet
    added to git included), unshipped ones excluded."""
    folder = f"packages/{package.folder}/"
    names = releases.git("diff", "--name-only", rev, "--", folder).split()
    names += releases.git("ls-files", "--others", "--exclude-standard", "--", folder).split()
    return [n for n in names if not n.removeprefix(folder).startswith(UNSHIPPED)]


def changelog_problems(package: Package, record: list[Release]) -> list[str]:
    """Where the CHANGELOG's headings disagree with the version and the recorded releases."""
    name, version = package.folder, package.version
    released = {r.version: r for r in releases.releases_of(name, record)}
    try:
        headings = workspace.changelog_headings(package)
    except ValueError as error:
        return [str(error)]
    found = []
    top = headings[0] if headings else None
    if version in released:
        date = released[version].date
        if top is None or (top.version, top.date) != (version, date):
            found.append(
                f"{name}: CHANGELOG.md's top entry is {top.line if top else 'missing'!r} but "
                f"{version} was released on {date}: '## [{version}] - {date}' comes first (for "
                "new changes, set the next version in pyproject.toml)."
            )
    else:
        last = releases.last_release(name, record)
        if last and Version(version) <= Version(last.version):
            found.append(
                f"{name}: version {version} is not newer than its last release {last.version}; "
                "set a newer version in pyproject.toml."
            )
        if top is None or top.date or top.version not in (None, version):
            found.append(
                f"{name}: {version} is not released yet, so CHANGELOG.md's top entry must be "
                f"'## Unreleased' (or '## [{version}]'), not {top.line if top else 'missing'!r}."
            )
    for heading in headings[1:]:
        release = released.get(heading.version)
        if release is None:
            found.append(
                f"{name}: CHANGELOG.md's {heading.line!r} is no release in {releases.RECORD}; "
                "only the top entry may be unreleased."
            )
        elif release.date != heading.date:
            found.append(
                f"{name}: CHANGELOG.md's {heading.line!r} should read "
                f"'## [{release.version}] - {release.date}', the date in {releases.RECORD}."
            )
    listed = {h.version for h in headings}
    found += [
        f"{name}: {r.version} is released ({r.date}) but CHANGELOG.md has no entry for it."
        for r in released.values()
        if r.version not in listed
    ]
    return found


def unreleased_change(package: Package, record: list[Release]) -> str | None:
    """Why the package's released version no longer describes its files, if it does not."""
    release = releases.release_of(package.folder, package.version, record)
    if release is None or release.commit is None or not changed_since(package, release.commit):
        return None
    return (
        f"{package.folder}: files changed since {package.version} was released (commit "
        f"{release.commit[:10]}, {release.date}); set a new version in pyproject.toml and list "
        "the changes under '## Unreleased' in CHANGELOG.md."
    )


def unmet_sibling_requirements(package: Package, record: list[Release]) -> list[str]:
    """The package's sibling requirements that no recorded release of that sibling meets."""
    found = []
    for text in (*package.dependencies, *package.extra_dependencies):
        requirement = Requirement(text)
        sibling = requirement.name.removeprefix(workspace.DISTRIBUTION_PREFIX)
        if sibling == requirement.name or sibling == package.folder:
            continue
        last = releases.last_release(sibling, record)
        if last is None or not requirement.specifier.contains(last.version, prereleases=True):
            found.append(
                f"{package.folder}: requires {text} but the last release of {sibling} is "
                f"{last.version if last else 'none'}; release {sibling} first (nox -s release -- "
                f"{sibling}) or relax the requirement."
            )
    return found


def readme_version(readme: str, package: Package) -> str | None:
    """The version in the last cell of the package's row of the README's package table
    (`| [name](packages/<folder>) | ... | 0.4.1 (a status note) |`); None without a row."""
    row = re.search(
        rf"^\| \[[^\]]+\]\(packages/{re.escape(package.folder)}\) \|.*\| *([0-9][^ |]*)[^|]*\| *$",
        readme,
        re.M,
    )
    return row.group(1) if row else None


def problems(since: str | None) -> list[str]:
    found = []
    record = releases.recorded()
    readme_path = workspace.ROOT / "README.md"
    readme = readme_path.read_text() if readme_path.exists() else None
    for package in all_packages():
        found += changelog_problems(package, record)
        found += unmet_sibling_requirements(package, record)
        if readme is not None and (listed := readme_version(readme, package)) != package.version:
            found.append(
                f"{package.folder}: README.md's package table gives {listed or 'no row'} but "
                f"pyproject.toml says {package.version}; update the table's row."
            )
        if since is None:
            if problem := unreleased_change(package, record):
                found.append(problem)
        elif releases.version_at(package.folder, since) == package.version and changed_since(
            package, since
        ):
            found.append(
                f"{package.folder}: files changed since {since} but the version is still "
                f"{package.version}; bump it in pyproject.toml and CHANGELOG.md."
            )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", help="count changes since this git revision, not the release")
    args = parser.parse_args()
    found = problems(args.since)
    for line in found:
        print(f"version check: {line}")
    if not found:
        print(f"version check: {len(all_packages())} packages consistent")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
