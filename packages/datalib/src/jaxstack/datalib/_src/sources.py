"""Random-access document sources: in-memory, text files (by file or by line), JSONL.

The source protocol is Grain's `RandomAccessDataSource`: `__len__` and `__getitem__(index)`
returning one document. A document is a `str`, or a dict with an int array under "tokens" (and
optionally "loss_mask") for pre-tokenized data such as `ChatTemplate.encode` output. A source
may return None for a record it skipped as bad. Sources must be cheap to send to worker
processes, so file-backed ones hold paths and offsets, never open handles.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstack.datalib._src.badrecords import BadRecords, OnError
from jaxstack.datalib._src.errors import ConfigError, EmptySourceError

_BLANK_BYTES = np.frombuffer(b" \t\r\n\v\f", dtype=np.uint8)


def resolve_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Expand globs (sorted, so the order is the same on every machine); a miss is an error."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    out: list[str] = []
    for pattern in map(os.fspath, paths):
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise EmptySourceError(f"glob {pattern!r} matches no files", path=pattern)
            out.extend(matches)
        else:
            out.append(pattern)
    if not out:
        raise EmptySourceError("no paths given")
    return out


def _is_blank_file(path: str) -> bool:
    """Empty or whitespace only (a file that cannot be read is reported when it is read)."""
    try:
        size = os.path.getsize(path)
        if size > 4096:  # a real document, or a corner case not worth reading here
            return False
        with open(path, "rb") as f:
            return not f.read().strip()
    except OSError:
        return False


def _require_text(paths: list[str]) -> None:
    """Refuse files that hold no text at all: training on them silently yields nan losses."""
    if not all(_is_blank_file(p) for p in paths):
        return
    fix = "point the source at files with text"
    if len(paths) == 1:
        raise EmptySourceError(f"holds no documents (empty or blank); {fix}", path=paths[0])
    named = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    raise EmptySourceError(f"all {len(paths)} files hold no documents (empty or blank): {named}")


def _require_documents(n: int, what: str) -> None:
    if n == 0:
        raise EmptySourceError(f"{what} holds no documents; check the paths and filters")


class InMemorySource:
    """Documents held in a Python sequence (tests, small corpora, generated data)."""

    def __init__(self, documents: Sequence[Any]):
        self._docs = list(documents)
        _require_documents(len(self._docs), "InMemorySource")

    def __len__(self) -> int:
        return len(self._docs)

    def __getitem__(self, index: int):
        return self._docs[index]

    def __repr__(self) -> str:
        return f"InMemorySource({len(self)} documents)"


class _LineIndex:
    """Byte offsets of the non-blank lines of several files, built once with NumPy."""

    def __init__(self, paths: list[str], bad: BadRecords):
        files, starts, lengths, lines = [], [], [], []
        for i, path in enumerate(paths):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                bad(f"unreadable file ({e.strerror or e})", path=path)
                continue
            raw = np.frombuffer(data, dtype=np.uint8)
            newlines = np.flatnonzero(raw == 10)
            begin = np.concatenate([[0], newlines + 1])
            end = np.concatenate([newlines, [len(raw)]])
            # Lines of only whitespace are not documents: count non-blank bytes per line.
            solid = np.concatenate([[0], np.cumsum(~np.isin(raw, _BLANK_BYTES))])
            idx = np.flatnonzero(solid[end] - solid[begin] > 0)
            files.append(np.full(len(idx), i, np.int32))
            starts.append(begin[idx])
            lengths.append(end[idx] - begin[idx])
            lines.append(idx.astype(np.int64) + 1)
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)
        self.file = cat(files, np.int32)
        self.start = cat(starts, np.int64)
        self.length = cat(lengths, np.int64)
        self.line = cat(lines, np.int64)

    def __len__(self) -> int:
        return len(self.file)


class _LineRecords:
    """Shared machinery of line-oriented sources: index, random reads, error locations."""

    def __init__(self, paths, on_error: OnError, kind: str):
        self.paths = resolve_paths(paths)
        _require_text(self.paths)
        self._bad = BadRecords(on_error)
        self._index = _LineIndex(self.paths, self._bad)
        _require_documents(len(self._index), f"{kind}({self.paths[0]!r}, ...)")

    @property
    def skipped(self) -> int:
        """Bad records skipped so far in this process (always 0 with on_error="raise")."""
        return self._bad.skipped

    def __len__(self) -> int:
        return len(self._index)

    def _read(self, index: int) -> tuple[bytes, str, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} records")
        ix = self._index
        path = self.paths[ix.file[index]]
        with open(path, "rb") as f:
            f.seek(int(ix.start[index]))
            data = f.read(int(ix.length[index]))
        return data, path, int(ix.line[index])

    def _decode(self, data: bytes, path: str, line: int) -> str | None:
        try:
            return data.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            self._bad(f"not UTF-8 ({e.reason} at byte {e.start})", path=path, line=line)
            return None


class TextSource:
    """Plain-text files, one document per file (`unit="file"`) or per non-blank line.

    Args:
      paths: a path, a glob (`data/**/*.txt`) or a list of them; globs are sorted.
      unit: "file" or "line".
      on_error: "raise" fails on an unreadable or non-UTF-8 file/line naming it; "skip" drops
        it, counts it in `skipped` and logs the first few.
    """

    def __init__(self, paths, *, unit: str = "file", on_error: OnError = "raise"):
        if unit not in ("file", "line"):
            raise ConfigError(f"unit={unit!r}; use 'file' or 'line'")
        self.unit = unit
        if unit == "line":
            self._lines: _LineRecords | None = _LineRecords(paths, on_error, "TextSource")
            self.paths = self._lines.paths
        else:
            self._lines = None
            self.paths = resolve_paths(paths)
            _require_text(self.paths)
            self._bad = BadRecords(on_error)

    @property
    def skipped(self) -> int:
        return self._lines.skipped if self._lines else self._bad.skipped

    def __len__(self) -> int:
        return len(self._lines) if self._lines else len(self.paths)

    def __getitem__(self, index: int) -> str | None:
        if self._lines is not None:
            return self._lines._decode(*self._lines._read(index))
        path = self.paths[index]
        try:
            with open(path, encoding="utf-8", newline="") as f:
                return f.read()
        except OSError as e:
            self._bad(f"unreadable file ({e.strerror or e})", path=path)
        except UnicodeDecodeError as e:
            self._bad(f"not UTF-8 ({e.reason} at byte {e.start})", path=path)
        return None

    def __repr__(self) -> str:
        return f"TextSource({len(self.paths)} files, unit={self.unit!r}, {len(self)} documents)"


class JsonlSource(_LineRecords):
    """JSON Lines: one JSON object per non-blank line, random access by a line-offset index.

    Args:
      paths: a path, glob or list of them.
      field: the key holding the document (default "text"); a list of keys returns a dict of
        those keys (e.g. ["messages"] for chat data); None returns the whole record.
      on_error: "raise" fails on a bad JSON line or a missing field with file and line;
        "skip" drops the record and counts it in `skipped`.
    """

    def __init__(
        self, paths, *, field: str | Sequence[str] | None = "text", on_error: OnError = "raise"
    ):
        super().__init__(paths, on_error, "JsonlSource")
        self.field = field

    def __getitem__(self, index: int):
        data, path, line = self._read(index)
        text = self._decode(data, path, line)
        if text is None:
            return None
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            self._bad(f"bad JSON ({e.msg} at column {e.colno})", path=path, line=line)
            return None
        if self.field is None:
            return record
        if not isinstance(record, dict):
            self._bad(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
            return None
        keys = [self.field] if isinstance(self.field, str) else list(self.field)
        missing = [k for k in keys if k not in record]
        if missing:
            self._bad(
                f"missing field {missing[0]!r} (record has {sorted(record)})", path=path, line=line
            )
            return None
        if isinstance(self.field, str):
            value = record[self.field]
            if not isinstance(value, str):
                self._bad(
                    f"field {self.field!r} is {type(value).__name__}, expected a string",
                    path=path,
                    line=line,
                )
                return None
            return value
        return {k: record[k] for k in keys}

    def __repr__(self) -> str:
        return f"JsonlSource({len(self.paths)} files, field={self.field!r}, {len(self)} records)"
