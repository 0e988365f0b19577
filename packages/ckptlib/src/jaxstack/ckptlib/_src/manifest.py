"""The manifest of a checkpoint and its two checks.

The manifest records what a checkpoint is (step, tree description, leaf shapes and dtypes,
package versions, metrics) and the size and SHA-256 of every file in it. Two checks use it:

* `quick_check` (stat only): every listed file exists with its size. It catches partial copies
  and truncated files at the cost of a directory walk; `latest_step()` relies on it.
* `verify` (reads every byte): recomputes the hashes. It catches flipped bits too; `restore()`
  runs it by default before trusting a checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jaxstack.ckptlib._src import layout

FORMAT = "jaxstack-ckptlib/1"
_CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class VerificationResult:
    """Outcome of checking one checkpoint against its manifest.

    Attributes:
      step: the checkpoint's step (None when the manifest itself is unreadable).
      path: the checkpoint's directory.
      ok: True when nothing is wrong.
      problems: human-readable descriptions of what is wrong, one per line.
    """

    step: int | None
    path: Path
    ok: bool
    problems: tuple[str, ...] = ()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path) -> list[str]:
    out = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel != layout.MANIFEST_FILE:
                out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def hash_files(root: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """{name: {"size", "sha256"}}; hashlib releases the GIL, so threads overlap the reads."""

    def one(name: str) -> tuple[str, dict[str, Any]]:
        path = root / name
        return name, {"size": path.stat().st_size, "sha256": sha256_file(path)}

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, names))


def build(root: Path, header: dict[str, Any]) -> dict[str, Any]:
    """The manifest of the checkpoint being written in `root` (all other files are final)."""
    return {"format": FORMAT, **header, "files": hash_files(root, _files(root))}


def load(root: Path) -> dict[str, Any]:
    manifest = layout.read_json(root / layout.MANIFEST_FILE)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{root / layout.MANIFEST_FILE} is not a {FORMAT} manifest")
    return manifest


def _read_manifest(root: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return load(root), None
    except FileNotFoundError:
        return None, f"{root.name}: no {layout.MANIFEST_FILE} (an incomplete checkpoint)"
    except (ValueError, json.JSONDecodeError, OSError) as e:
        return None, f"{root.name}: unreadable manifest ({e})"


def quick_check(root: Path) -> VerificationResult:
    """Manifest readable, every file present with its recorded size (no bytes read)."""
    manifest, problem = _read_manifest(root)
    if manifest is None:
        return VerificationResult(None, root, False, (problem or "",))
    problems = []
    for name, entry in manifest["files"].items():
        try:
            size = (root / name).stat().st_size
        except FileNotFoundError:
            problems.append(f"{name}: missing")
            continue
        if size != entry["size"]:
            problems.append(f"{name}: {size} bytes, manifest says {entry['size']}")
    return VerificationResult(manifest["step"], root, not problems, tuple(problems))


def verify(root: Path) -> VerificationResult:
    """Recompute every file's SHA-256 and compare with the manifest; report all differences."""
    quick = quick_check(root)
    if not quick.ok:
        return quick
    manifest = load(root)
    listed = manifest["files"]
    actual = hash_files(root, sorted(listed))
    problems = [
        f"{name}: sha256 {actual[name]['sha256'][:12]}..., manifest says {entry['sha256'][:12]}..."
        for name, entry in listed.items()
        if actual[name]["sha256"] != entry["sha256"]
    ]
    extra = sorted(set(_files(root)) - set(listed))
    problems += [f"{name}: not in the manifest (added after the commit)" for name in extra]
    return VerificationResult(manifest["step"], root, not problems, tuple(problems))
