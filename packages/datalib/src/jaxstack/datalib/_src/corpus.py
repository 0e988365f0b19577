"""The default corpus: the Python standard library's own sources, read from this interpreter.

Every machine with Python has it, so the project's main job trains offline with no download and
no data file committed. Documents are whole `.py` files (code, comments and docstrings), ~10 MB
on CPython 3.12.

Determinism: the file list is the stdlib folder of `sysconfig.get_paths()["stdlib"]`, walked in
sorted order with relative `/`-joined paths, without the folders that distributions split out
or that are not library code (`_EXCLUDED_DIRS`). Two machines with the same Python minor version
(and the same patch release, for byte-identical content) see the same documents in the same
order. The split is fixed by a stable hash of each relative path: a file belongs to validation
when the first 8 bytes of SHA-256(path), as a big-endian integer, mod 100 are below
`VALIDATION_PERCENT`. Adding or removing a file never moves another file between splits.

No cache is needed: listing the folder takes milliseconds and documents are read on access.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig

from jaxstack.datalib._src.errors import ConfigError, EmptySourceError

VALIDATION_PERCENT = 5
"""The share (in percent) of the default corpus's files in the validation split; a file's
split is fixed by a hash of its relative path (`split_of`), so it never moves."""
# Test suites, GUI and demo code, and packages that Debian/Ubuntu/Fedora ship separately.
_EXCLUDED_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "lib2to3",
        "ensurepip",
        "distutils",
        "venv",
        "site-packages",
        "dist-packages",
        "__pycache__",
    }
)


def split_of(relative_path: str) -> str:
    """'train' or 'validation' for a corpus file, from its relative path alone."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    bucket = int.from_bytes(digest[:8], "big") % 100
    return "validation" if bucket < VALIDATION_PERCENT else "train"


def _stdlib_files(root: str) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if d not in _EXCLUDED_DIRS and not d.startswith(("config-", "."))
        )
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if rel == "." else rel + "/"
        found.extend(prefix + f for f in sorted(files) if f.endswith(".py"))
    return sorted(found)


class DefaultCorpus:
    """The stdlib corpus for one split, as a random-access source of `str` documents.

    Attributes:
      root: the stdlib folder read.
      relative_paths: the documents' file paths relative to `root`, in index order.
      python_version: "3.12" etc.; the corpus is the same across machines with this version.
    """

    def __init__(self, split: str = "train", *, root: str | None = None):
        if split not in ("train", "validation"):
            raise ConfigError(f"split={split!r}; use 'train' or 'validation'")
        self.split = split
        self.root = root or sysconfig.get_paths()["stdlib"]
        self.python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
        if not os.path.isdir(self.root):
            raise EmptySourceError(f"standard library folder {self.root!r} does not exist")
        self.relative_paths = [p for p in _stdlib_files(self.root) if split_of(p) == split]
        if not self.relative_paths:
            raise EmptySourceError(f"no .py files for split {split!r} under {self.root!r}")

    def __len__(self) -> int:
        return len(self.relative_paths)

    def __getitem__(self, index: int) -> str:
        path = os.path.join(self.root, self.relative_paths[index])
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return f.read()

    def num_bytes(self) -> int:
        """Total size of the split's files on disk."""
        return sum(os.path.getsize(os.path.join(self.root, p)) for p in self.relative_paths)

    def fingerprint(self) -> str:
        """SHA-256 over paths and contents: equal fingerprints mean identical corpora."""
        h = hashlib.sha256()
        for i, rel in enumerate(self.relative_paths):
            h.update(rel.encode("utf-8") + b"\0" + self[i].encode("utf-8") + b"\0")
        return h.hexdigest()

    def __repr__(self) -> str:
        return (
            f"DefaultCorpus(split={self.split!r}, python={self.python_version}, "
            f"{len(self)} documents)"
        )


def default_corpus(split: str = "train") -> DefaultCorpus:
    """The project's default data: Python's standard library sources, split train/validation.

    See the module docstring for the file selection, the split rule and determinism.
    """
    return DefaultCorpus(split)
