"""Versions of the packages that wrote a checkpoint, recorded in its manifest."""

from __future__ import annotations

import importlib.metadata

_DISTRIBUTIONS = ("jaxstack-ckptlib", "jax", "jaxlib", "orbax-checkpoint", "tensorstore", "numpy")


def package_versions() -> dict[str, str]:
    """Installed versions of the distributions a checkpoint's bytes depend on."""
    versions = {}
    for name in _DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
