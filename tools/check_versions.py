"""Release check: every package's CHANGELOG top entry is its version, and a changed package has
a new version before it is released.

A release of package X at version V is the git tag `jaxstack-X-vV`. A package whose files changed
since its latest release tag but whose version still equals that tag's version fails the check.
With `--since REV`, changes are counted since REV instead (useful in review: what this branch did).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib

from workspace import ROOT, Package, all_packages, changelog_top_version


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout


def latest_release(package: Package) -> tuple[str, str] | None:
    """(tag, version) of the package's newest release tag, if any."""
    prefix = f"{package.distribution}-v"
    tags = git("tag", "--list", f"{prefix}*", "--sort=-v:refname").split()
    return (tags[0], tags[0].removeprefix(prefix)) if tags else None


def changed_since(package: Package, rev: str) -> bool:
    relative = package.path.relative_to(ROOT).as_posix()
    return bool(git("diff", "--name-only", rev, "--", relative).strip())


def problems(since: str | None) -> list[str]:
    found = []
    for package in all_packages():
        top = changelog_top_version(package)
        if top != package.version:
            found.append(
                f"{package.folder}: CHANGELOG.md top entry is [{top}] but pyproject.toml says "
                f"{package.version}; add a '## [{package.version}]' entry (or fix the version)."
            )
        if since:
            base, base_version = since, version_at(package, since)
        elif release := latest_release(package):
            base, base_version = release
        else:
            continue
        if base_version == package.version and changed_since(package, base):
            found.append(
                f"{package.folder}: files changed since {base} but the version is still "
                f"{package.version}; bump it in pyproject.toml and CHANGELOG.md."
            )
    return found


def version_at(package: Package, rev: str) -> str | None:
    relative = (package.path / "pyproject.toml").relative_to(ROOT).as_posix()
    text = git("show", f"{rev}:{relative}")
    return tomllib.loads(text)["project"]["version"] if text else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", help="count changes since this git revision, not the last tag")
    args = parser.parse_args()
    found = problems(args.since)
    for line in found:
        print(f"version check: {line}")
    if not found:
        print(f"version check: {len(all_packages())} packages consistent")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
