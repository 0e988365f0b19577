"""The release check catches a CHANGELOG/version mismatch and a change made after a release
under the released number, with releases found from history alone (no tags)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import check_versions
import workspace


def write_package(root: Path, version: str, changelog_version: str, notes: str = "- x") -> None:
    folder = root / "packages" / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "jaxstack-demo"\nversion = "{version}"\ndependencies = []\n'
    )
    (folder / "CHANGELOG.md").write_text(f"# Changelog\n\n## [{changelog_version}]\n\n{notes}\n")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace, "PACKAGES_DIR", tmp_path / "packages")
    monkeypatch.setattr(workspace, "ROOT", tmp_path)

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    clock = iter(range(1_700_000_000, 1_800_000_000, 60))  # a commit a minute

    def commit(message, after_hours=0):
        date = f"@{next(clock) + after_hours * 3600} +0000"
        git("add", "-A")
        subprocess.run(
            ["git", "commit", "-qm", message],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            env={**os.environ, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date},
        )
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
        ).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    return tmp_path, commit


def change_source(root: Path, text: str) -> None:
    (root / "packages" / "demo" / "module.py").write_text(text)


def test_consistent_package_passes(repo):
    root, _ = repo
    write_package(root, "0.1.0", "0.1.0")
    assert check_versions.problems(since=None) == []


def test_changelog_mismatch_is_reported(repo):
    root, _ = repo
    write_package(root, "0.2.0", "0.1.0")
    [problem] = check_versions.problems(since=None)
    assert "top entry is [0.1.0]" in problem and "0.2.0" in problem


def test_a_stale_or_missing_readme_row_is_reported(repo):
    root, _ = repo
    write_package(root, "0.2.0", "0.2.0")
    row = "| [demo](packages/demo) | `jaxstack.demo` | a demo | {} |\n"
    (root / "README.md").write_text("| package | import | what | version |\n" + row.format("0.1.0"))
    [problem] = check_versions.problems(since=None)
    assert "README.md's package table gives 0.1.0" in problem and "says 0.2.0" in problem

    (root / "README.md").write_text(row.format("0.2.0 (GPU speed not yet measured)"))
    assert check_versions.problems(since=None) == []

    (root / "README.md").write_text("no table\n")
    [problem] = check_versions.problems(since=None)
    assert "gives no row" in problem


def test_a_change_after_the_releasing_session_needs_a_new_version(repo):
    root, commit = repo
    write_package(root, "0.1.0", "0.1.0")
    first = commit("demo 0.1.0")
    change_source(root, "x = 0\n")
    released = commit("demo: same session")
    change_source(root, "x = 1\n")
    commit("demo: next session", after_hours=10)
    [problem] = check_versions.problems(since=None)
    assert f"since 0.1.0 was released (commit {released[:10]}" in problem
    assert f"its first commit {first[:10]}" in problem

    write_package(root, "0.2.0", "0.2.0")  # the bump, not committed yet
    assert check_versions.problems(since=None) == []
    commit("demo 0.2.0")
    assert check_versions.problems(since=None) == []


def test_a_version_bumped_in_this_session_may_still_grow(repo):
    root, commit = repo
    write_package(root, "0.1.0", "0.1.0")
    commit("demo 0.1.0")
    write_package(root, "0.2.0", "0.2.0")
    commit("demo 0.2.0", after_hours=10)
    change_source(root, "x = 2\n")
    commit("demo: more work on 0.2.0, same session")
    assert check_versions.problems(since=None) == []


def test_test_only_changes_need_no_new_version(repo):
    root, commit = repo
    write_package(root, "0.1.0", "0.1.0")
    commit("demo 0.1.0")
    (root / "packages" / "demo" / "tests").mkdir()
    (root / "packages" / "demo" / "tests" / "test_x.py").write_text("def test(): pass\n")
    commit("demo: a test")
    assert check_versions.problems(since=None) == []


def test_since_a_revision_counts_changes_from_there(repo):
    root, commit = repo
    write_package(root, "0.1.0", "0.1.0")
    base = commit("demo 0.1.0")
    change_source(root, "x = 1\n")
    write_package(root, "0.1.0", "0.1.0", notes="- x\n- y")
    [problem] = check_versions.problems(since=base)
    assert f"changed since {base}" in problem
