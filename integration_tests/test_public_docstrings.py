"""Every public name of every package (each name in its `__all__`) has a docstring of its own,
so that its API reference page (docs/reference/, generated from `__all__`) shows what it is and
how to call it rather than a bare signature or its source.

A class counts only with a docstring of its own: not one inherited from a base class, nor the
`Name(field, ...)` line that dataclasses and NamedTuples write when there is none. A constant
counts with a docstring string right under its assignment, as mkdocstrings (griffe) reads it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import re
import sys
from functools import cache
from pathlib import Path

PACKAGES = (
    "nnlib",
    "optlib",
    "ckptlib",
    "datalib",
    "kernlib",
    "quantlib",
    "trainer",
    "rl",
    "serving",
    "xprof_lite",
)


@cache
def attribute_docstrings(source_file: str) -> dict[str, str]:
    """The module-level names that a source file assigns with a docstring string right after."""
    body = ast.parse(Path(source_file).read_text()).body
    docs = {}
    for statement, following in itertools.pairwise(body):
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            for target in targets:
                if isinstance(target, ast.Name):
                    docs[target.id] = following.value.value
    return docs


def own_docstring(package_name: str, name: str, value: object) -> str:
    """The docstring a reader of `package.name`'s reference entry sees ("" if none)."""
    if inspect.isclass(value):
        doc = value.__dict__.get("__doc__") or ""
        return "" if re.fullmatch(rf"{re.escape(value.__name__)}\(.*\)", doc.strip(), re.S) else doc
    if inspect.ismodule(value) or inspect.isroutine(value) or callable(value):
        return getattr(value, "__doc__", None) or ""
    # A constant: its docstring is the string under its assignment in the module defining it.
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith(package_name + ".") or module is None:
            continue
        defines = module.__dict__.get(name, None) is value and getattr(module, "__file__", None)
        if defines and (doc := attribute_docstrings(module.__file__).get(name)):
            return doc
    return ""


def test_every_public_name_has_a_docstring():
    missing = []
    for folder in PACKAGES:
        package = importlib.import_module(f"jaxstack.{folder}")
        for name in package.__all__:
            if not own_docstring(package.__name__, name, getattr(package, name)).strip():
                missing.append(f"{package.__name__}.{name}")
    assert not missing, f"{len(missing)} public names without a docstring: " + ", ".join(missing)
