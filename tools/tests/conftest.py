"""A throwaway workspace in a fresh git repository, for the release tools' tests: packages with a
pyproject and a CHANGELOG, commits a minute apart (or hours, to cross what the old rule took for
the end of a working session)."""

import os
import subprocess
import sys
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import workspace


@dataclass
class Repo:
    root: Path
    seconds: count = field(default_factory=lambda: count(1_700_000_000, 60))

    def git(self, *args: str, env: dict | None = None) -> str:
        return subprocess.run(
            ["git", *args], cwd=self.root, check=True, capture_output=True, text=True, env=env
        ).stdout.strip()

    def write_package(
        self,
        version: str,
        changelog: str = "## Unreleased\n\n- x\n",
        *,
        name: str = "demo",
        requires: tuple[str, ...] = (),
    ) -> None:
        folder = self.root / "packages" / name
        folder.mkdir(parents=True, exist_ok=True)
        dependencies = ", ".join(f'"{r}"' for r in requires)
        (folder / "pyproject.toml").write_text(
            f'[project]\nname = "jaxstack-{name}"\nversion = "{version}"\n'
            f"dependencies = [{dependencies}]\n"
        )
        (folder / "CHANGELOG.md").write_text(f"# Changelog of jaxstack-{name}\n\n{changelog}")

    def change_source(self, text: str, name: str = "demo") -> None:
        (self.root / "packages" / name / "module.py").write_text(text)

    def commit(self, message: str, after_hours: float = 0) -> str:
        """Commit everything, a minute after the previous commit (plus `after_hours`)."""
        date = f"@{next(self.seconds) + int(after_hours * 3600)} +0000"
        self.git("add", "-A")
        env = {**os.environ, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date}
        self.git("commit", "-qm", message, env=env)
        return self.git("rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Repo:
    monkeypatch.setattr(workspace, "ROOT", tmp_path)
    monkeypatch.setattr(workspace, "PACKAGES_DIR", tmp_path / "packages")
    made = Repo(tmp_path)
    made.git("init", "-q")
    made.git("config", "user.email", "t@example.invalid")
    made.git("config", "user.name", "t")
    return made
