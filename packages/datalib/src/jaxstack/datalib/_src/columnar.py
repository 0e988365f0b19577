"""Record-file sources: ArrayRecord (Grain's random-access format) and Parquet (an extra).

Both read lazily on first access in each process, so they travel to worker processes as paths
and open their readers where they run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

from jaxstack.datalib._src import atomic, badrecords
from jaxstack.datalib._src.errors import ConfigError, EmptySourceError, SourceError
from jaxstack.datalib._src.sources import resolve_paths


class ArrayRecordSource:
    """ArrayRecord files through `grain.sources.ArrayRecordDataSource`, decoded to documents.

    Args:
      paths: file paths or globs.
      field: None if each record is UTF-8 text; a key if records are JSON objects (the
        document is that field).
      on_error: "raise" or "skip" for records that do not decode (the "line" reported is the
        0-based record index).
    """

    def __init__(self, paths, *, field: str | None = None, on_error: badrecords.OnError = "raise"):
        from jaxstack.datalib._src.nojax import grain

        self.paths = resolve_paths(paths)
        for path in self.paths:
            if not os.path.isfile(path):
                raise SourceError("no such ArrayRecord file", path=path)
        self.field = field
        self._bad = badrecords.BadRecords(on_error)
        self._source = grain.sources.ArrayRecordDataSource(self.paths)
        if len(self._source) == 0:
            raise EmptySourceError("ArrayRecord files hold no records", path=self.paths[0])

    @property
    def skipped(self) -> int:
        return self._bad.skipped

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int):
        raw = self._source[index]
        where = (
            self.paths[0] if len(self.paths) == 1 else f"{self.paths[0]} (+{len(self.paths) - 1})"
        )
        try:
            text = raw.decode("utf-8")
            if self.field is None:
                return text
            value = json.loads(text)[self.field]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            self._bad(f"record {index} does not decode ({e!r})", path=where, line=index)
            return None
        return value

    def __repr__(self) -> str:
        return f"ArrayRecordSource({len(self.paths)} files, {len(self)} records)"


def write_array_record(path: str | os.PathLike, documents: Iterable[str | bytes]) -> int:
    """Write documents to one ArrayRecord file (atomically: a temporary name, then renamed).

    Returns the number of records written.
    """
    from array_record.python import array_record_module

    count = 0
    with atomic.replacing(path) as tmp:
        writer = array_record_module.ArrayRecordWriter(str(tmp), "group_size:1")
        try:
            for doc in documents:
                writer.write(doc.encode("utf-8") if isinstance(doc, str) else doc)
                count += 1
        finally:
            writer.close()
    return count


class ParquetSource:
    """One column of Parquet files (needs the `parquet` extra: pyarrow).

    Row counts come from the file footers at construction; the column itself is read on first
    access in each process.
    """

    def __init__(self, paths, *, column: str = "text"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(
                "ParquetSource needs pyarrow: pip install 'jaxstack-datalib[parquet]'"
            ) from None
        self.paths = resolve_paths(paths)
        self.column = column
        self._rows: list[int] = []
        for path in self.paths:
            try:
                meta = pq.ParquetFile(path)
            except Exception as e:  # pyarrow raises several unrelated types here
                raise SourceError(f"not a readable Parquet file ({e})", path=path) from None
            if column not in meta.schema_arrow.names:
                raise SourceError(
                    f"no column {column!r} (columns: {meta.schema_arrow.names})", path=path
                )
            self._rows.append(meta.metadata.num_rows)
        if sum(self._rows) == 0:
            raise EmptySourceError("Parquet files hold no rows", path=self.paths[0])
        self._values: Sequence | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_values"] = None  # workers read the files themselves
        return state

    def _load(self) -> Sequence:
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(p, columns=[self.column]) for p in self.paths]
        return pa.concat_tables(tables).column(self.column)

    def __len__(self) -> int:
        return sum(self._rows)

    def __getitem__(self, index: int):
        if self._values is None:
            self._values = self._load()
        return self._values[index].as_py()

    def __repr__(self) -> str:
        return f"ParquetSource({len(self.paths)} files, column={self.column!r}, {len(self)} rows)"
