"""The release check catches a CHANGELOG/version mismatch and a change made after a release
under the released number, with releases found from history alone (no tags)."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import check_versions
import releases
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

    def commit(message):
        git("add", "-A")
        git("commit", "-qm", message)
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


def test_change_after_the_first_commit_of_a_version_needs_a_new_version(repo):
    root, commit = repo
    write_package(root, "0.1.0", "0.1.0")
    commit("demo 0.1.0")
    change_source(root, "x = 1\n")
    commit("demo: change")
    [problem] = check_versions.problems(since=None)
    first = releases.release_of("demo", "0.1.0").commit
    assert f"since 0.1.0 was released (its first commit {first[:10]})" in problem

    write_package(root, "0.2.0", "0.2.0")  # the bump, not committed yet
    assert check_versions.problems(since=None) == []
    commit("demo 0.2.0")
    assert check_versions.problems(since=None) == []


def test_a_bumped_version_may_grow_while_its_entry_records_the_work(repo):
    root, commit = repo
    write_package(root, "0.2.0", "0.2.0", notes="- first change")
    commit("demo 0.2.0")
    change_source(root, "x = 2\n")
    write_package(root, "0.2.0", "0.2.0", notes="- first change\n- second change")
    commit("demo: second change, recorded in the 0.2.0 entry")
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
