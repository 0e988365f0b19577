"""Release check: every package's CHANGELOG top entry is its version, and a package whose shipped
files changed after its release has a new version (or says what changed in its version's entry).

The repository keeps no tags: the release of version V is the first commit whose
`pyproject.toml` says V (tools/releases.py). A package whose shipped files (everything in its
folder but `tests/`) changed since the release of its current version, while that version's
CHANGELOG entry still reads as it did at the release, fails: the change went out under a number
that already means something else. A version bumped in this change (no commit has it yet) passes.
With `--since REV`, changes are counted since REV instead, and any change needs a version other
than the one at REV (useful in review: what this branch did).
"""

from __future__ import annotations

import argparse
import re
import sys

import releases
from workspace import Package, all_packages, changelog_top_version

UNSHIPPED = ("tests/",)


def changed_since(package: Package, rev: str) -> list[str]:
    """Files of the package that differ between `rev` and the working tree, tests excluded."""
    folder = f"packages/{package.folder}/"
    names = releases.git("diff", "--name-only", rev, "--", folder).split()
    return [n for n in names if not n.removeprefix(folder).startswith(UNSHIPPED)]


def changelog_entry(text: str, version: str) -> str:
    """The lines of the `## [version]` entry of a CHANGELOG."""
    match = re.search(rf"^## \[{re.escape(version)}\].*?(?=^## \[|\Z)", text, re.M | re.S)
    return match.group(0).strip() if match else ""


def unreleased_change(package: Package) -> str | None:
    """Why the package's current version no longer describes its files, if it does not."""
    release = releases.release_of(package.folder, package.version)
    if release is None or not changed_since(package, release.commit):
        return None
    path = f"packages/{package.folder}/CHANGELOG.md"
    then = changelog_entry(releases.git("show", f"{release.commit}:{path}"), package.version)
    now = changelog_entry((package.path / "CHANGELOG.md").read_text(), package.version)
    if then != now:
        return None
    return (
        f"{package.folder}: files changed since {package.version} was released (its first commit "
        f"{release.commit[:10]}) and its CHANGELOG entry does not say so; bump the version in "
        "pyproject.toml and CHANGELOG.md."
    )


def problems(since: str | None) -> list[str]:
    found = []
    for package in all_packages():
        top = changelog_top_version(package)
        if top != package.version:
            found.append(
                f"{package.folder}: CHANGELOG.md top entry is [{top}] but pyproject.toml says "
                f"{package.version}; add a '## [{package.version}]' entry (or fix the version)."
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
