"""Release points come from history: each version's first commit, oldest first."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import releases
import workspace


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace, "ROOT", tmp_path)
    folder = tmp_path / "packages" / "demo"
    folder.mkdir(parents=True)
    heads = []

    def commit(version: str, other: str = "") -> str:
        (folder / "pyproject.toml").write_text(
            f'[project]\nname = "jaxstack-demo"\nversion = "{version}"\n{other}'
        )
        (folder / "module.py").write_text(f"# {version} {len(heads)}\n")
        subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
        subprocess.run(["git", "commit", "-qm", version], cwd=tmp_path, check=True)
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
        ).stdout.strip()
        heads.append(head)
        return head

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "config", "user.email", "t@example.invalid"], cwd=tmp_path, check=True)
    subprocess.run(["git", "config", "user.name", "t"], cwd=tmp_path, check=True)
    return commit


def test_each_version_is_released_at_its_first_commit(repo):
    first = repo("0.1.0")
    repo("0.1.0", other="dependencies = []\n")  # same version, later commit
    second = repo("0.2.0")
    repo("0.2.0", other="dependencies = []\n")
    assert releases.releases("demo") == [
        releases.Release("0.1.0", first),
        releases.Release("0.2.0", second),
    ]
    assert releases.last_release("demo") == releases.Release("0.2.0", second)
    assert releases.release_of("demo", "0.1.0").commit == first
    assert releases.release_of("demo", "0.3.0") is None


def test_history_is_read_as_of_a_revision(repo):
    first = repo("0.1.0")
    repo("0.2.0")
    assert releases.releases("demo", rev=first) == [releases.Release("0.1.0", first)]
    assert releases.version_at("demo", first) == "0.1.0"
    assert releases.version_at("missing", first) is None


def test_a_release_is_extracted_as_it_was(repo, tmp_path):
    first = repo("0.1.0")
    repo("0.2.0")
    folder = releases.extract("demo", first, tmp_path / "out")
    assert 'version = "0.1.0"' in (folder / "pyproject.toml").read_text()
    assert (folder / "module.py").read_text() == "# 0.1.0 0\n"


def test_a_version_is_released_with_the_last_commit_of_its_session(repo):
    import os
    import subprocess

    first = repo("0.1.0")
    same_session = repo("0.1.0", other="dependencies = []\n")
    assert releases.session_end(first) is None  # its session is the newest: not released yet
    later = "@1900000000 +0000"
    env = {**os.environ, "GIT_COMMITTER_DATE": later, "GIT_AUTHOR_DATE": later}
    root = releases.workspace.ROOT
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "later"], cwd=root, env=env,
                   check=True)  # fmt: skip
    assert releases.session_end(first) == same_session
