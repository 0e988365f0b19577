"""Release points of the workspace's packages, recovered from git history alone.

The repository keeps no tags. A package's version lives in `packages/<name>/pyproject.toml`, so
version V begins at the first commit whose `pyproject.toml` says V: walking the history of that
one file, oldest first, gives every version the package has had and where each began. Work on a
version goes on for the working session that introduced it (a run of commits with no pause
longer than SESSION_GAP_S between them); the version is released with the last commit of that
session. A version whose session is still the newest one in the history is not released yet.

    python tools/releases.py            # every package: each version and its first commit
    python tools/releases.py trainer    # one package
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import workspace

SESSION_GAP_S = 4 * 3600


@dataclass(frozen=True)
class Release:
    version: str
    commit: str  # the first commit with this version


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=workspace.ROOT, capture_output=True, text=True, check=False
    ).stdout


def pyproject_path(folder: str) -> str:
    return f"packages/{folder}/pyproject.toml"


def version_at(folder: str, rev: str) -> str | None:
    """The package's version in commit `rev`, or None if the package did not exist there."""
    text = git("show", f"{rev}:{pyproject_path(folder)}")
    return tomllib.loads(text)["project"]["version"] if text else None


def releases(folder: str, rev: str = "HEAD") -> list[Release]:
    """Every version of the package in the history of `rev`, oldest first, each with its first
    commit (the commit where `pyproject.toml` first had that version)."""
    commits = git("log", "--reverse", "--format=%H", rev, "--", pyproject_path(folder)).split()
    found: list[Release] = []
    seen: set[str] = set()
    for commit in commits:
        version = version_at(folder, commit)
        if version is not None and version not in seen:
            seen.add(version)
            found.append(Release(version, commit))
    return found


def release_of(folder: str, version: str, rev: str = "HEAD") -> Release | None:
    """The release of `version` (its first commit), or None if no commit has had it yet."""
    return next((r for r in releases(folder, rev) if r.version == version), None)


def last_release(folder: str, rev: str = "HEAD") -> Release | None:
    """The release of the version the package has in `rev`."""
    version = version_at(folder, rev)
    return release_of(folder, version, rev) if version else None


def session_end(commit: str, rev: str = "HEAD") -> str | None:
    """The last commit of the working session `commit` belongs to, or None while that session is
    the newest in the history of `rev` (its version is still being built)."""
    history = [
        line.split() for line in git("log", "--reverse", "--format=%H %ct", rev).splitlines()
    ]
    index = next(i for i, (sha, _) in enumerate(history) if sha == commit)
    while index + 1 < len(history):
        if int(history[index + 1][1]) - int(history[index][1]) > SESSION_GAP_S:
            return history[index][0]
        index += 1
    return None


def last_released(folder: str, rev: str = "HEAD") -> tuple[Release, str] | None:
    """The newest released version of the package and the commit that released it."""
    for release in reversed(releases(folder, rev)):
        if end := session_end(release.commit, rev):
            return release, end
    return None


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


def main(argv: list[str]) -> int:
    folders = argv or [p.folder for p in workspace.all_packages()]
    for folder in folders:
        history = ", ".join(f"{r.version} @ {r.commit[:10]}" for r in releases(folder))
        print(f"{folder}: {history or 'no commit yet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
