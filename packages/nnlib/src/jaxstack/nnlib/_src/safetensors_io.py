"""Minimal streaming safetensors reader/writer on NumPy memory maps (bfloat16 included).

The format is an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, then raw little-endian bytes. Reading maps the file and copies one tensor at a
time, so loading a checkpoint never holds more than the tensor being converted plus the model.
We read it ourselves because the safetensors NumPy API cannot represent bfloat16.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np

from jaxstack.nnlib._src.errors import Error

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsFile:
    """Lazy view of one .safetensors file: `keys()`, `shape(name)`, `get(name)`."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self.metadata = header.pop("__metadata__", {}) or {}
        self.header = header
        self._offset = 8 + n
        self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")

    def keys(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info["dtype"] not in _DTYPES:
            raise Error(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        raw = self._mmap[self._offset + start : self._offset + end]
        return np.array(raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"]))


def save_file(
    tensors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
    path: str | os.PathLike,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write tensors atomically (temporary name, then rename)."""
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name, arr in items:
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _NAMES:
            raise Error(f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot store")
        header[name] = {
            "dtype": _NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
    os.replace(tmp, path)
