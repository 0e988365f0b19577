"""The tuning cache: autotuning winners as JSON, keyed by device kind, op and argument spec.

Two layers are merged on lookup: the user cache (written by `jaxstack-kern autotune`, in
`$JAXSTACK_KERNLIB_CACHE_DIR`, else `$XDG_CACHE_HOME/jaxstack/kernlib`, else
`~/.cache/jaxstack/kernlib`) wins over the defaults shipped inside the package. A spec key of
`"*"` is a per-device-kind default for an op. Writes are atomic (temporary file, then rename).

File format (`format` is checked on read)::

    {"format": "jaxstack-kernlib-tuning/1",
     "entries": {"<device kind>": {"<op>": {"<spec>": {"implementation": "pallas_triton",
                                                       "config": {...}, "median_ms": 1.2}}}}}
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from jaxstack.kernlib._src.errors import TuningCacheError

FORMAT = "jaxstack-kernlib-tuning/1"
SHIPPED_PATH = Path(__file__).with_name("tuned_defaults.json")
WILDCARD = "*"


def cache_dir() -> Path:
    """kernlib's directory on this machine: tuning winners, and the C++ kernels built here."""
    if env := os.environ.get("JAXSTACK_KERNLIB_CACHE_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "jaxstack" / "kernlib"


def user_cache_path() -> Path:
    """Where `jaxstack-kern autotune` records winners on this machine."""
    return cache_dir() / "autotune.json"


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TuningCacheError(
            f"tuning cache {path} is unreadable ({e}); delete it or re-run jaxstack-kern autotune"
        ) from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise TuningCacheError(
            f"tuning cache {path} has format {found!r}, expected {FORMAT!r}; delete it or "
            f"re-run jaxstack-kern autotune"
        )
    return data.get("entries", {})


class TuningCache:
    """Merged view of shipped defaults and the user cache; re-reads files when they change."""

    def __init__(self, user_path: Path | None = None, shipped_path: Path = SHIPPED_PATH):
        self._user_path = Path(user_path) if user_path is not None else None
        self.shipped_path = Path(shipped_path)
        self._lock = threading.Lock()
        self._loaded: dict[Path, tuple[float, dict[str, Any]]] = {}

    @property
    def user_path(self) -> Path:
        return self._user_path if self._user_path is not None else user_cache_path()

    def _entries(self, path: Path) -> dict[str, Any]:
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        with self._lock:
            cached = self._loaded.get(path)
            if cached is None or cached[0] != mtime:
                cached = (mtime, _read(path))
                self._loaded[path] = cached
            return cached[1]

    def lookup(self, device_kind: str, op: str, spec: str) -> dict[str, Any] | None:
        """The recorded winner for (device kind, op, spec): user cache first, then shipped."""
        for path in (self.user_path, self.shipped_path):
            per_op = self._entries(path).get(device_kind, {}).get(op, {})
            for key in (spec, WILDCARD):
                if key in per_op:
                    return per_op[key]
        return None

    def record(self, device_kind: str, op: str, spec: str, entry: dict[str, Any]) -> Path:
        """Store one winner in the user cache (read-modify-write, atomic rename)."""
        path = self.user_path
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read(path)
        entries.setdefault(device_kind, {}).setdefault(op, {})[spec] = entry
        payload = json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autotune-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(payload + "\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def all_entries(self) -> dict[str, Any]:
        """Shipped entries overlaid with user entries (for `jaxstack-kern show`)."""
        merged: dict[str, Any] = {}
        for path in (self.shipped_path, self.user_path):
            for kind, ops in self._entries(path).items():
                for op, specs in ops.items():
                    merged.setdefault(kind, {}).setdefault(op, {}).update(specs)
        return merged


_default_cache = TuningCache()


def default_cache() -> TuningCache:
    return _default_cache
