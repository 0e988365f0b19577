"""The release check catches a CHANGELOG/version mismatch and a changed-but-unbumped package."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import check_versions
import workspace


def write_package(root: Path, version: str, changelog_version: str) -> None:
    folder = root / "packages" / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "jaxstack-demo"\nversion = "{version}"\ndependencies = []\n'
    )
    (folder / "CHANGELOG.md").write_text(f"# Changelog\n\n## [{changelog_version}]\n\n- x\n")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace, "PACKAGES_DIR", tmp_path / "packages")
    monkeypatch.setattr(check_versions, "ROOT", tmp_path)
    monkeypatch.setattr(workspace, "ROOT", tmp_path)

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    return tmp_path, git


def test_consistent_package_passes(repo):
    root, _ = repo
    write_package(root, "0.1.0", "0.1.0")
    assert check_versions.problems(since=None) == []


def test_changelog_mismatch_is_reported(repo):
    root, _ = repo
    write_package(root, "0.2.0", "0.1.0")
    [problem] = check_versions.problems(since=None)
    assert "top entry is [0.1.0]" in problem and "0.2.0" in problem


def test_change_after_release_tag_needs_a_new_version(repo):
    root, git = repo
    write_package(root, "0.1.0", "0.1.0")
    git("add", "-A")
    git("commit", "-qm", "release")
    git("tag", "jaxstack-demo-v0.1.0")
    (root / "packages" / "demo" / "new.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "change")
    [problem] = check_versions.problems(since=None)
    assert "changed since jaxstack-demo-v0.1.0" in problem
    write_package(root, "0.1.1", "0.1.1")
    assert check_versions.problems(since=None) == []
