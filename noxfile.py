"""Nox sessions of the jaxstack workspace.

Every session builds a fresh virtual environment with uv. `tests` installs one package ALONE, with
only its declared dependencies (its jaxstack siblings from their folders, everything else pinned
by uv.lock), which is what proves that `pip install jaxstack-<x>` works by itself.

    nox -l                                  # list sessions
    nox -s lint layers versions             # static checks
    nox -s "tests(package='datalib')"       # one package in isolation
    nox -s "integration(backend='cpu')"     # cross-package scenarios
    nox -s "compat_release(package='nnlib')" # the scenario with nnlib at its release
    nox -s release -- nnlib                 # record nnlib's current version as released today
    nox -s docs                             # the documentation site, strict, offline
    nox -s docs-tutorials                   # every tutorial run from start to end
"""

from __future__ import annotations

import datetime
import os
import sys
import tomllib
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent / "tools"))
import releases
from workspace import Package, all_packages, closure, load_package

nox.options.default_venv_backend = "uv"
# Where PYTHONDONTWRITEBYTECODE is set (some CI images set it), every Python process a session
# starts (pytest, and each test's subprocess) compiles jax, flax and optax from source again:
# 4-5 s for `import jax` alone on a 2-core AMD EPYC, 1.7 s with bytecode. The sessions' venvs
# are fresh and thrown away, so they keep the bytecode their first import writes.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["lint", "layers", "versions", "tests", "integration(backend='cpu')"]

PACKAGES = [p.folder for p in all_packages()]
# --durations: every CI log says which tests take the time budget.
PYTEST_DEFAULT = ["-q", "-m", "not slow", "--timeout=900", "--durations=8"]
TEST_TOOLS = ["pytest>=8", "pytest-timeout>=2.3"]
# The scenario asks the LLM server through the official client, as a user would.
INTEGRATION_TOOLS = [*TEST_TOOLS, "openai", "grimp>=3.5"]  # grimp: the import-cycle test
DOCS_TOOLS = [
    "mkdocs==1.6.1",
    "mkdocs-material==9.8.1",
    "mkdocstrings-python==2.0.11",
    "markdown-exec==1.12.6",
    "ruff>=0.8",  # mkdocstrings formats long signatures with it (one parameter a line)
]
# The tutorials talk to the LLM server through the official client, as a reader would.
TUTORIAL_TOOLS = ["openai"]
JAX_BACKEND_EXTRAS = {"cpu": None, "gpu": "jax[cuda13]", "tpu": "jax[tpu]"}
# The TPU compiler for ahead-of-time checks on CPU machines: the libtpu that jax 0.12 expects.
LIBTPU = "libtpu==0.0.51"
TPU_AOT_TESTS = [
    "packages/kernlib/tests/test_tpu_aot.py",
    "packages/trainer/tests/test_aot.py",
    "packages/serving/tests/test_tpu_aot.py",
]


def lock_constraints(session: nox.Session) -> str:
    """uv.lock exported as a pip constraints file, so sessions test the locked versions."""
    target = Path(session.create_tmp()) / "constraints.txt"
    session.run_install(
        "uv",
        "export",
        "--frozen",
        "--all-packages",
        "--all-groups",
        "--no-hashes",
        "--no-emit-workspace",
        "--quiet",
        "-o",
        str(target),
        external=True,
    )
    return str(target)


def install_packages(session: nox.Session, packages: list[Package], *extra: str) -> None:
    """Install packages from their folders (with their `test` extras), pinned by uv.lock."""
    requirements = [p.test_requirement for p in packages]
    session.install("-c", lock_constraints(session), *requirements, *extra)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.8")
    session.run("uv", "lock", "--check", "--quiet", external=True)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def layers(session: nox.Session) -> None:
    """The import contracts (layers, no JAX in datalib, no sibling's private modules), checked by
    import-linter over the sources and by tools/private_imports.py over tests and benchmarks, and
    the tests showing that a forbidden import breaks them."""
    session.install("import-linter>=2.17", "pytest>=8")
    sources = ":".join(str(p.path / "src") for p in all_packages())
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": sources})
    session.run("python", "tools/private_imports.py")
    session.run("pytest", "tools/tests", "-q")


@nox.session
def versions(session: nox.Session) -> None:
    """Versions, CHANGELOGs and releases.toml agree; changed packages carry a new version; every
    sibling requirement is met by a release (tools/check_versions.py)."""
    session.install("packaging>=24")
    session.run("python", "tools/check_versions.py", *session.posargs)


@nox.session(venv_backend="none")
def release(session: nox.Session) -> None:
    """Release the named packages at their current versions: `nox -s release -- trainer`. Dates
    each CHANGELOG's top entry and records the release in releases.toml; the commit of those
    files is the release."""
    if not session.posargs:
        session.error(f"name the packages to release, e.g. nox -s release -- {PACKAGES[0]}")
    today = datetime.datetime.now(datetime.UTC).date()
    for package in session.posargs:
        try:
            done = releases.record(package, today)
        except ValueError as error:
            session.error(str(error))
        session.log(f"{package} {done.version} recorded as released on {done.date}")
    session.log(f"commit {releases.RECORD} and the CHANGELOGs: that commit is the release")


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    install_packages(session, closure(package, with_test_extra=True), *TEST_TOOLS)
    session.run("pytest", f"packages/{package}/tests", *PYTEST_DEFAULT, *session.posargs)


@nox.session
@nox.parametrize("backend", list(JAX_BACKEND_EXTRAS))
def integration(session: nox.Session, backend: str) -> None:
    install_packages(session, all_packages(), *INTEGRATION_TOOLS)
    if extra := JAX_BACKEND_EXTRAS[backend]:
        session.install(extra)
        probe = f"import jax; print(any(d.platform == {backend!r} for d in jax.devices()))"
        if session.run("python", "-c", probe, silent=True).strip() != "True":
            session.skip(f"no {backend} device visible to JAX here; run this on a {backend} runner")
    session.run(
        "pytest",
        "integration_tests",
        *PYTEST_DEFAULT,
        *session.posargs,
        env={"JAXSTACK_TEST_BACKEND": backend, "JAX_PLATFORMS": backend},
    )


@nox.session
def tpu_aot(session: nox.Session) -> None:
    """Every TPU path compiled ahead of time, on this CPU machine, for v5e, v5p and v6e chips by
    the real TPU compiler (libtpu next to the locked jax; nothing runs on a chip): each kernlib
    Mosaic kernel forward and backward, the trainer's step for TPU slices (`--aot-topology`),
    and the serving engine's step for v6e with the Mosaic ragged paged attention. A compile
    failure fails the session. About 10 minutes on 2 busy cores, so only in `./dev test-all`."""
    packages = {
        p.folder: p
        for root in ("kernlib", "trainer", "serving")
        for p in closure(root, with_test_extra=True)
    }
    install_packages(session, list(packages.values()), *TEST_TOOLS, LIBTPU)
    env = {
        "JAX_PLATFORMS": "cpu",
        "TPU_SKIP_MDS_QUERY": "1",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",  # another process holding libtpu's lock is harmless
        "JAXSTACK_REQUIRE_LIBTPU": "1",
    }
    session.run("pytest", *TPU_AOT_TESTS, *PYTEST_DEFAULT, *session.posargs, env=env)


@nox.session
@nox.parametrize("resolution", ["lowest-direct", "highest"])
@nox.parametrize("package", PACKAGES)
def compat(session: nox.Session, package: str, resolution: str) -> None:
    """The package's tests against its lowest declared (or the newest) dependency versions."""
    requirements = [p.test_requirement for p in closure(package, with_test_extra=True)]
    session.install(f"--resolution={resolution}", *requirements, *TEST_TOOLS)
    session.run("uv", "pip", "list", external=True, silent=False)
    session.run("pytest", f"packages/{package}/tests", *PYTEST_DEFAULT, *session.posargs)


@nox.session
@nox.parametrize("package", PACKAGES)
def compat_release(session: nox.Session, package: str) -> None:
    """The end-to-end scenario with `package` at its last release (releases.toml) and every other
    package at HEAD. About 5 minutes each on 2 idle cores; in `./dev test-all`."""
    last = releases.last_release(package)
    if last is None:
        session.skip(f"{package}: no release recorded in {releases.RECORD} yet")
    if last.commit is None:  # recorded but not committed yet: the release is the working tree
        released = load_package(package).path
    else:
        released = releases.extract(package, last.commit, Path(session.create_tmp()) / "release")
    project = tomllib.loads((released / "pyproject.toml").read_text())["project"]
    extra = "[test]" if "test" in project.get("optional-dependencies", {}) else ""
    others = [p.test_requirement for p in all_packages() if p.folder != package]
    where = last.commit[:10] if last.commit else "the working tree"
    session.log(f"{package} {last.version} as released in {where}; the others from HEAD")
    # --no-sources: siblings resolve to the folders named here, not to the workspace's own
    session.install(
        "--no-sources",
        "-c",
        lock_constraints(session),
        *others,
        f"{released}{extra}",
        *INTEGRATION_TOOLS,
    )
    session.run(
        "pytest",
        "integration_tests/test_scenario.py",
        *PYTEST_DEFAULT,
        *session.posargs,
        env={"JAXSTACK_TEST_BACKEND": "cpu", "JAX_PLATFORMS": "cpu"},
    )


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml), built offline in strict mode: a broken link, a public
    name that cannot be documented or an example block that fails breaks the build."""
    install_packages(session, all_packages(), *DOCS_TOOLS)
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), *session.posargs)
    session.log(f"site written to {site}")


@nox.session(name="docs-tutorials")
def docs_tutorials(session: nox.Session) -> None:
    """Every tutorial (docs/tutorials/) run from start to end as a reader would, its bash and
    python blocks in order, in a fresh directory (tools/run_tutorials.py); a block that fails
    fails the session. About 10 minutes on 2 busy cores, so only in `./dev test-all`."""
    install_packages(session, all_packages(), *TUTORIAL_TOOLS)
    workdir = Path(session.create_tmp()) / "tutorials"
    session.run("python", "tools/run_tutorials.py", "--workdir", str(workdir), *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """Each package builds an sdist and a wheel; each wheel installs in a clean venv and imports."""
    dist = Path(session.create_tmp()) / "dist"
    session.run("uv", "build", "--all-packages", "--quiet", "-o", str(dist), external=True)
    for package in all_packages():
        wheels = [
            next(dist.glob(f"{p.distribution.replace('-', '_')}-{p.version}-*.whl"))
            for p in closure(package.folder)
        ]
        venv = Path(session.create_tmp()) / f"venv-{package.folder}"
        session.run("uv", "venv", "--quiet", "--python", sys.executable, str(venv), external=True)
        python = str(venv / "bin" / "python")
        session.run(
            "uv", "pip", "install", "--quiet", "--python", python, *map(str, wheels), external=True
        )
        module = "jaxstack." + package.folder.replace("-", "_")
        session.run(
            python, "-c", f"import {module}; print({module}.__name__, 'imports')", external=True
        )
