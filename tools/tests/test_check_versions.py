"""The release check against the record in `releases.toml`: CHANGELOG headings and their dates,
changes after a release commit, sibling requirements no release meets, the README's table."""

import datetime

import check_versions
import releases

DAY = datetime.date(2026, 12, 3)
RELEASED = "## [0.1.0] - 2026-12-03\n\n- x\n"


def released_demo(repo) -> str:
    """demo 0.1.0, released and committed; returns the release commit."""
    repo.write_package("0.1.0")
    releases.record("demo", DAY)
    return repo.commit("release demo 0.1.0")


def the_problem(repo, version: str, changelog: str) -> str:
    """The one problem the check finds with demo at `version` and this CHANGELOG."""
    repo.write_package(version, changelog)
    [problem] = check_versions.problems(since=None)
    return problem


def test_a_released_package_passes(repo):
    released_demo(repo)
    assert check_versions.problems(since=None) == []


def test_an_unreleased_version_needs_an_unreleased_top_entry(repo):
    repo.write_package("0.1.0", "## Unreleased\n\n- x\n")
    assert check_versions.problems(since=None) == []
    repo.write_package("0.1.0", "## [0.1.0]\n\n- x\n")
    assert check_versions.problems(since=None) == []
    problem = the_problem(repo, "0.1.0", RELEASED)  # dated, but no such release is recorded
    assert "0.1.0 is not released yet" in problem and "'## Unreleased'" in problem


def test_a_released_version_needs_its_dated_top_entry(repo):
    released_demo(repo)
    problem = the_problem(repo, "0.1.0", "## [0.1.0]\n\n- x\n")
    assert "0.1.0 was released on 2026-12-03: '## [0.1.0] - 2026-12-03' comes first" in problem

    problem = the_problem(repo, "0.1.0", "## Unreleased\n\n- y\n\n" + RELEASED)
    assert "top entry is '## Unreleased'" in problem and "set the next version" in problem


def test_older_entries_carry_their_recorded_dates(repo):
    released_demo(repo)
    problem = the_problem(repo, "0.2.0", "## Unreleased\n\n- y\n\n## [0.1.0] - 2026-12-01\n\n- x\n")
    assert "should read '## [0.1.0] - 2026-12-03'" in problem

    problem = the_problem(repo, "0.2.0", "## Unreleased\n\n- y\n")
    assert "0.1.0 is released (2026-12-03) but CHANGELOG.md has no entry" in problem

    problem = the_problem(repo, "0.2.0", "## Unreleased\n\n- y\n\n## [0.1.5]\n\n- z\n\n" + RELEASED)
    assert "'## [0.1.5]' is no release" in problem


def test_a_new_version_must_be_newer_than_the_last_release(repo):
    released_demo(repo)
    problem = the_problem(repo, "0.0.9", "## Unreleased\n\n- y\n\n" + RELEASED)
    assert "0.0.9 is not newer than its last release 0.1.0" in problem


def test_a_change_after_the_release_commit_needs_a_new_version_however_soon(repo):
    # The old rule (a release is the end of a working session) passed this: the change came a
    # minute after the release, in the same session.
    released = released_demo(repo)
    repo.change_source("x = 1\n")
    repo.commit("demo: a minute later")
    [problem] = check_versions.problems(since=None)
    assert f"since 0.1.0 was released (commit {released[:10]}, 2026-12-03)" in problem

    repo.write_package("0.2.0", "## Unreleased\n\n- y\n\n" + RELEASED)
    assert check_versions.problems(since=None) == []


def test_an_unreleased_version_may_grow_for_days(repo):
    # The old rule failed this: the version's session had ended, so it counted as released.
    released_demo(repo)
    repo.write_package("0.2.0", "## Unreleased\n\n- y\n\n" + RELEASED)
    repo.commit("demo 0.2.0 begins")
    repo.change_source("x = 2\n")
    repo.commit("demo: more work on 0.2.0", after_hours=30)
    assert check_versions.problems(since=None) == []


def test_test_and_changelog_changes_need_no_new_version(repo):
    released_demo(repo)
    (repo.root / "packages/demo/tests").mkdir()
    (repo.root / "packages/demo/tests/test_x.py").write_text("def test(): pass\n")
    repo.write_package("0.1.0", RELEASED + "- a typo fixed\n")
    repo.commit("demo: a test and a CHANGELOG fix")
    assert check_versions.problems(since=None) == []


def test_a_sibling_requirement_needs_a_release_that_meets_it(repo):
    released_demo(repo)
    repo.write_package("0.1.0", name="app", requires=("jaxstack-demo>=0.2", "numpy>=2"))
    [problem] = check_versions.problems(since=None)
    assert "app: requires jaxstack-demo>=0.2 but the last release of demo is 0.1.0" in problem

    # demo 0.2.0 at HEAD is not enough: compat_release(app) installs demo's last release
    problem = the_problem(repo, "0.2.0", "## Unreleased\n\n- y\n\n" + RELEASED)
    assert "the last release of demo is 0.1.0" in problem

    releases.record("demo", DAY)
    assert check_versions.problems(since=None) == []


def test_an_extra_requirement_counts_too(repo):
    released_demo(repo)
    folder = repo.root / "packages/app"
    repo.write_package("0.1.0", name="app")
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + '[project.optional-dependencies]\nx = ["jaxstack-demo>=0.3"]\n'
    )
    [problem] = check_versions.problems(since=None)
    assert "app: requires jaxstack-demo>=0.3" in problem


def test_a_stale_or_missing_readme_row_is_reported(repo):
    released_demo(repo)
    row = "| [demo](packages/demo) | `jaxstack.demo` | a demo | {} |\n"
    (repo.root / "README.md").write_text(
        "| package | import | what | version |\n" + row.format("0.0.9")
    )
    [problem] = check_versions.problems(since=None)
    assert "README.md's package table gives 0.0.9" in problem and "says 0.1.0" in problem

    (repo.root / "README.md").write_text(row.format("0.1.0 (GPU speed not yet measured)"))
    assert check_versions.problems(since=None) == []

    (repo.root / "README.md").write_text("no table\n")
    [problem] = check_versions.problems(since=None)
    assert "gives no row" in problem


def test_an_unknown_heading_is_reported(repo):
    problem = the_problem(repo, "0.1.0", "## Version 0.1.0\n\n- x\n")
    assert "heading '## Version 0.1.0' is none of" in problem


def test_since_a_revision_counts_changes_from_there(repo):
    base = released_demo(repo)
    repo.change_source("x = 1\n")
    [problem] = check_versions.problems(since=base)
    assert f"changed since {base}" in problem
