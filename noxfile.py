"""Nox sessions of the jaxstack workspace.

Every session builds a fresh virtual environment with uv. `tests` installs one package ALONE, with
only its declared dependencies (its jaxstack siblings from their folders, everything else pinned
by uv.lock), which is what proves that `pip install jaxstack-<x>` works by itself.

    nox -l                                  # list sessions
    nox -s lint layers versions             # static checks
    nox -s "tests(package='datalib')"       # one package in isolation
    nox -s "integration(backend='cpu')"     # cross-package scenarios
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent / "tools"))
from workspace import Package, all_packages, closure

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["lint", "layers", "versions", "tests", "integration(backend='cpu')"]

PACKAGES = [p.folder for p in all_packages()]
PYTEST_DEFAULT = ["-q", "-m", "not slow", "--timeout=900"]
TEST_TOOLS = ["pytest>=8", "pytest-timeout>=2.3"]
JAX_BACKEND_EXTRAS = {"cpu": None, "gpu": "jax[cuda13]", "tpu": "jax[tpu]"}


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
    """CHANGELOG top entries match versions; changed packages carry a new version."""
    session.run("python", "tools/check_versions.py", *session.posargs)


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    install_packages(session, closure(package, with_test_extra=True), *TEST_TOOLS)
    session.run("pytest", f"packages/{package}/tests", *PYTEST_DEFAULT, *session.posargs)


@nox.session
@nox.parametrize("backend", list(JAX_BACKEND_EXTRAS))
def integration(session: nox.Session, backend: str) -> None:
    install_packages(session, all_packages(), *TEST_TOOLS)
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
@nox.parametrize("resolution", ["lowest-direct", "highest"])
@nox.parametrize("package", PACKAGES)
def compat(session: nox.Session, package: str, resolution: str) -> None:
    """The package's tests against its lowest declared (or the newest) dependency versions."""
    requirements = [p.test_requirement for p in closure(package, with_test_extra=True)]
    session.install(f"--resolution={resolution}", *requirements, *TEST_TOOLS)
    session.run("uv", "pip", "list", external=True, silent=False)
    session.run("pytest", f"packages/{package}/tests", *PYTEST_DEFAULT, *session.posargs)


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
