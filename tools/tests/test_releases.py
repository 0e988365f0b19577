"""Releases are records: `releases.toml` lists them, and a release's commit is the one that added
its entry (or the commit a back-filled entry names), whatever the history's timing."""

import datetime
import re

import pytest
import releases

DAY = datetime.date(2026, 12, 3)


def test_record_dates_the_changelog_and_appends_the_entry(repo):
    repo.write_package("0.1.0", "## Unreleased\n\n- first\n")
    release = releases.record("demo", DAY)
    assert release == releases.Release("demo", "0.1.0", DAY, None)
    changelog = (repo.root / "packages/demo/CHANGELOG.md").read_text()
    assert changelog == "# Changelog of jaxstack-demo\n\n## [0.1.0] - 2026-12-03\n\n- first\n"
    assert releases.recorded() == [release]  # recorded, not committed yet

    repo.write_package("0.2.0", "## [0.2.0]\n\n- second\n\n## [0.1.0] - 2026-12-03\n\n- first\n")
    releases.record("demo", DAY + datetime.timedelta(days=1))
    assert [(r.version, r.date) for r in releases.recorded()] == [
        ("0.1.0", DAY),
        ("0.2.0", datetime.date(2026, 12, 4)),
    ]
    assert "## [0.2.0] - 2026-12-04\n" in (repo.root / "packages/demo/CHANGELOG.md").read_text()


def test_record_refuses_a_version_already_released_or_older(repo):
    repo.write_package("0.2.0")
    releases.record("demo", DAY)
    repo.write_package("0.2.0", "## Unreleased\n\n- more\n\n## [0.2.0] - 2026-12-03\n\n- x\n")
    with pytest.raises(
        ValueError, match=re.escape("0.2.0 was released on 2026-12-03; set the next version")
    ):
        releases.record("demo", DAY)
    repo.write_package("0.1.5", "## Unreleased\n\n- more\n\n## [0.2.0] - 2026-12-03\n\n- x\n")
    with pytest.raises(
        ValueError, match=re.escape("0.1.5 is not newer than its last release 0.2.0")
    ):
        releases.record("demo", DAY)


def test_record_names_the_packages_when_one_is_unknown(repo):
    repo.write_package("0.1.0")
    with pytest.raises(ValueError, match="no package 'dmeo' in packages/; the packages: demo"):
        releases.record("dmeo", DAY)


def test_record_needs_the_changes_under_an_unreleased_heading(repo):
    repo.write_package("0.2.0", "## [0.1.0] - 2026-12-01\n\n- x\n")
    with pytest.raises(ValueError, match="must start with '## Unreleased'"):
        releases.record("demo", DAY)
    assert not (repo.root / releases.RECORD).exists()


def test_the_release_commit_is_the_one_that_added_the_entry(repo):
    repo.write_package("0.1.0")
    repo.commit("demo 0.1.0")
    releases.record("demo", DAY)
    released = repo.commit("release demo 0.1.0")
    repo.change_source("x = 1\n")
    repo.commit("demo: later work", after_hours=10)
    repo.write_package("0.2.0", "## Unreleased\n\n- y\n\n## [0.1.0] - 2026-12-03\n\n- x\n")
    repo.commit("demo 0.2.0, not released")
    assert releases.recorded() == [releases.Release("demo", "0.1.0", DAY, released)]
    assert releases.last_release("demo").commit == released
    assert releases.release_of("demo", "0.2.0") is None


def test_a_back_filled_entry_names_its_commit(repo):
    repo.write_package("0.1.0")
    first = repo.commit("demo 0.1.0")
    (repo.root / releases.RECORD).write_text(
        f'[[release]]\npackage = "demo"\nversion = "0.1.0"\ndate = 2026-11-30\ncommit = "{first}"\n'
    )
    repo.commit("releases.toml, back-filled")
    assert releases.last_release("demo") == releases.Release(
        "demo", "0.1.0", datetime.date(2026, 11, 30), first
    )


def test_versions_are_ordered_as_versions_not_as_text(repo):
    repo.write_package("0.9.0")
    releases.record("demo", DAY)
    repo.write_package("0.10.0", "## Unreleased\n\n- y\n\n## [0.9.0] - 2026-12-03\n\n- x\n")
    releases.record("demo", DAY)
    assert releases.last_release("demo").version == "0.10.0"


def test_each_release_is_tagged_once_committed(repo):
    repo.write_package("0.1.0")
    releases.record("demo", DAY)
    released = repo.commit("release demo 0.1.0")
    repo.write_package("0.2.0", "## Unreleased\n\n- y\n\n## [0.1.0] - 2026-12-03\n\n- x\n")
    releases.record("demo", DAY)  # not committed: no commit to tag yet
    assert releases.tag() == ["jaxstack-demo-v0.1.0"]
    assert repo.git("rev-list", "-n1", "jaxstack-demo-v0.1.0") == released
    assert releases.tag() == []


def test_a_release_is_extracted_as_it_was(repo, tmp_path):
    repo.write_package("0.1.0")
    repo.change_source("# as released\n")
    releases.record("demo", DAY)
    released = repo.commit("release demo 0.1.0")
    repo.change_source("# later\n")
    repo.commit("demo: later")
    folder = releases.extract("demo", released, tmp_path / "out")
    assert 'version = "0.1.0"' in (folder / "pyproject.toml").read_text()
    assert (folder / "module.py").read_text() == "# as released\n"


def test_the_command_line_records_and_lists(repo):
    repo.write_package("0.1.0")
    assert releases.main(["record", "demo"]) == 0
    repo.commit("release demo 0.1.0")
    listing = repo.git("show", f"HEAD:{releases.RECORD}")
    assert 'package = "demo"\nversion = "0.1.0"\n' in listing
    assert releases.main(["record", "demo"]) == 1  # already released
