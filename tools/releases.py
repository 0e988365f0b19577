"""The record of the workspace's releases: `releases.toml` at the repository root.

One entry per released package version, with its date. The release itself is a commit: the one
that added the entry to `releases.toml` (a release commit records the entry and dates the
CHANGELOG heading together, so its tree is the package as released). Entries back-filled from the
history before the file existed name their commit instead. Pushing commits is enough to publish
the record; `tags` also writes it as git tags `jaxstack-<package>-v<version>` where those travel.

    python tools/releases.py                  # every package's releases
    python tools/releases.py trainer          # one package's
    python tools/releases.py record trainer   # release trainer's current version today
    python tools/releases.py tags             # a git tag for each committed release
"""

from __future__ import annotations

import datetime
import io
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import workspace
from packaging.version import Version

RECORD = "releases.toml"
HEADER = """\
# Every release of the workspace's packages, oldest first. Written by `nox -s release -- <package>`
# (tools/releases.py); read by the version check and the compat_release sessions.
#
# A release is the commit that added its entry to this file. An entry with a `commit` names its
# release commit instead: those back-filled from the history before this file, where a version's
# release is the last commit of the working session that introduced it (no pause over four hours
# between commits), or the last commit that had the version if a later one replaced it within
# that session.
"""


@dataclass(frozen=True)
class Release:
    package: str
    version: str
    date: datetime.date
    commit: str | None  # None until the entry is committed

    @property
    def tag(self) -> str:
        return f"{workspace.DISTRIBUTION_PREFIX}{self.package}-v{self.version}"


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=workspace.ROOT, capture_output=True, text=True, check=False
    ).stdout


def version_at(folder: str, rev: str) -> str | None:
    """The package's version in commit `rev`, or None if the package did not exist there."""
    text = git("show", f"{rev}:packages/{folder}/pyproject.toml")
    return tomllib.loads(text)["project"]["version"] if text else None


def entries(text: str) -> list[dict]:
    return tomllib.loads(text).get("release", [])


def adding_commits() -> dict[tuple[str, str], str]:
    """(package, version) -> the first commit whose `releases.toml` has that entry."""
    found: dict[tuple[str, str], str] = {}
    for commit in git("log", "--reverse", "--format=%H", "HEAD", "--", RECORD).split():
        for entry in entries(git("show", f"{commit}:{RECORD}")):
            found.setdefault((entry["package"], entry["version"]), commit)
    return found


def recorded() -> list[Release]:
    """The releases in the working tree's `releases.toml`, in file order, each with its commit."""
    path = workspace.ROOT / RECORD
    listed = entries(path.read_text()) if path.exists() else []
    added = adding_commits() if any("commit" not in e for e in listed) else {}
    return [
        Release(
            e["package"],
            e["version"],
            e["date"],
            e.get("commit") or added.get((e["package"], e["version"])),
        )
        for e in listed
    ]


def releases_of(folder: str, record: list[Release] | None = None) -> list[Release]:
    """The package's releases, oldest version first."""
    mine = [r for r in (recorded() if record is None else record) if r.package == folder]
    return sorted(mine, key=lambda r: Version(r.version))


def release_of(folder: str, version: str, record: list[Release] | None = None) -> Release | None:
    return next((r for r in releases_of(folder, record) if r.version == version), None)


def last_release(folder: str, record: list[Release] | None = None) -> Release | None:
    return next(reversed(releases_of(folder, record)), None)


def extract(folder: str, commit: str, destination: Path) -> Path:
    """Write the package's folder as it was in `commit` under `destination`; returns its path."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, f"packages/{folder}"],
        cwd=workspace.ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")
    return destination / "packages" / folder


def record(folder: str, today: datetime.date) -> Release:
    """Release the package's current version: date its top CHANGELOG heading (`## Unreleased` or
    `## [V]`) and append the entry to `releases.toml`. Committing both makes the release."""
    known = [p.folder for p in workspace.all_packages()]
    if folder not in known:
        raise ValueError(f"no package {folder!r} in packages/; the packages: {', '.join(known)}.")
    package = workspace.load_package(folder)
    if done := release_of(folder, package.version):
        raise ValueError(
            f"{folder} {package.version} was released on {done.date}; set the next version in "
            f"packages/{folder}/pyproject.toml first."
        )
    if (last := last_release(folder)) and Version(package.version) <= Version(last.version):
        raise ValueError(
            f"{folder} {package.version} is not newer than its last release {last.version}; "
            f"set a newer version in packages/{folder}/pyproject.toml."
        )
    top = workspace.changelog_headings(package)[:1]
    if not top or top[0].date or top[0].version not in (None, package.version):
        raise ValueError(
            f"packages/{folder}/CHANGELOG.md must start with '## Unreleased' (or "
            f"'## [{package.version}]') listing what {package.version} changes."
        )
    changelog = package.path / "CHANGELOG.md"
    lines = changelog.read_text().split("\n")
    lines[lines.index(top[0].line)] = f"## [{package.version}] - {today.isoformat()}"
    changelog.write_text("\n".join(lines))
    path = workspace.ROOT / RECORD
    text = path.read_text() if path.exists() else HEADER
    entry = f'\n[[release]]\npackage = "{folder}"\nversion = "{package.version}"\ndate = {today}\n'
    path.write_text(text + entry)
    return Release(folder, package.version, today, None)


def tag() -> list[str]:
    """Tag each committed release that has no tag yet; returns the new tags."""
    existing = set(git("tag", "--list", f"{workspace.DISTRIBUTION_PREFIX}*").split())
    made = []
    for release in recorded():
        if release.commit and release.tag not in existing:
            subprocess.run(
                ["git", "tag", release.tag, release.commit], cwd=workspace.ROOT, check=True
            )
            made.append(release.tag)
    return made


def main(argv: list[str]) -> int:
    if argv[:1] == ["record"]:
        if len(argv) == 1:
            print("releases: name the package(s) to release: record <package>...", file=sys.stderr)
            return 2
        for folder in argv[1:]:
            try:
                release = record(folder, datetime.datetime.now(datetime.UTC).date())
            except ValueError as error:
                print(f"releases: {error}", file=sys.stderr)
                return 1
            print(f"releases: {folder} {release.version} recorded as released on {release.date}")
        print(f"releases: commit {RECORD} with the CHANGELOG(s): that commit is the release")
        return 0
    if argv == ["tags"]:
        print("\n".join(tag()) or "releases: every committed release is tagged already")
        return 0
    for folder in argv or [p.folder for p in workspace.all_packages()]:
        history = ", ".join(
            f"{r.version} {r.date} @ {r.commit[:10] if r.commit else 'uncommitted'}"
            for r in releases_of(folder)
        )
        print(f"{folder}: {history or 'no release yet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
