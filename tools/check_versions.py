"""Release check: every package's CHANGELOG top entry is its version, the root README's package
table gives that version, and a package whose shipped files changed after its release has a new
version.

The repository keeps no tags: version V begins at the first commit whose `pyproject.toml` says V
and is released with the last commit of the working session that introduced it
(tools/releases.py). A package whose shipped files (everything in its folder but `tests/`)
changed after the release of its current version fails: the change would go out under a number
that already means something else. A version bumped in the current session is not released yet
and passes, however many commits follow the bump. With `--since REV`, changes are counted since
REV instead, and any change needs a version other than the one at REV (useful in review).
"""

from __future__ import annotations

import argparse
import re
import sys

import releases
import workspace
from workspace import Package, all_packages, changelog_top_version

UNSHIPPED = ("tests/",)


def changed_since(package: Package, rev: str) -> list[str]:
    """Files of the package that differ between `rev` and the working tree, tests excluded."""
    folder = f"packages/{package.folder}/"
    names = releases.git("diff", "--name-only", rev, "--", folder).split()
    return [n for n in names if not n.removeprefix(folder).startswith(UNSHIPPED)]


def unreleased_change(package: Package) -> str | None:
    """Why the package's current version no longer describes its files, if it does not."""
    begun = releases.release_of(package.folder, package.version)
    released = begun and releases.session_end(begun.commit)
    if not released or not changed_since(package, released):
        return None
    return (
        f"{package.folder}: files changed since {package.version} was released (commit "
        f"{released[:10]}, the end of the session of its first commit {begun.commit[:10]}); "
        "bump the version in pyproject.toml and CHANGELOG.md."
    )


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
    readme_path = workspace.ROOT / "README.md"
    readme = readme_path.read_text() if readme_path.exists() else None
    for package in all_packages():
        top = changelog_top_version(package)
        if top != package.version:
            found.append(
                f"{package.folder}: CHANGELOG.md top entry is [{top}] but pyproject.toml says "
                f"{package.version}; add a '## [{package.version}]' entry (or fix the version)."
            )
        if readme is not None and (listed := readme_version(readme, package)) != package.version:
            found.append(
                f"{package.folder}: README.md's package table gives {listed or 'no row'} but "
                f"pyproject.toml says {package.version}; update the table's row."
            )
        if since is None:
            if problem := unreleased_change(package):
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
