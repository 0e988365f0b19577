"""The on-disk layout of one exported model version, shared by the writer and the reader.

An artifact is a directory of five files and nothing executable:

    model.stablehlo       jax.export serialisation (StableHLO + calling convention)
    weights.safetensors   the parameters, one tensor per `/`-joined leaf path
    signature.json        input/output names, dtypes, shapes (batch dimension as -1)
    metadata.json         name, version, jax version, platforms, user metadata
    manifest.json         sha256 and size of each file above; written last

The manifest is the commit marker: a directory without one is a partial export or copy. The
exported computation is called as `exported.call(weights, inputs)` with `weights` a dict from
leaf path to array and `inputs` a dict from input name to array; it returns a dict from output
name to array, every one with the batch dimension first.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from jaxstack.serving._src.errors import ArtifactError

FORMAT = "jaxstack-serving-artifact"
FORMAT_VERSION = 1
MODEL_FILE = "model.stablehlo"
WEIGHTS_FILE = "weights.safetensors"
SIGNATURE_FILE = "signature.json"
METADATA_FILE = "metadata.json"
MANIFEST_FILE = "manifest.json"
CONTENT_FILES = (MODEL_FILE, WEIGHTS_FILE, SIGNATURE_FILE, METADATA_FILE)
BATCH_DIM = "batch"

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
# ASCII only: str.isdigit() also accepts "²" and "١", which int() refuses or reads as 1.
VERSION_PATTERN = re.compile(r"[0-9]+")


def parse_version(text: str) -> int | None:
    """The version number a directory name or URL segment spells (>= 1), or None."""
    if not VERSION_PATTERN.fullmatch(text):
        return None
    version = int(text)
    return version if version >= 1 else None


# KServe v2 datatype names; BF16 is the common extension used by Triton.
_DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}
_DTYPES = {v: k for k, v in _DATATYPES.items()}


def datatype_of(dtype: Any) -> str:
    """KServe v2 datatype name of a NumPy/JAX dtype (`float32` -> `FP32`)."""
    name = np.dtype(dtype).name
    if name not in _DATATYPES:
        raise ArtifactError(
            f"dtype {name!r} has no KServe v2 datatype; use one of {sorted(_DATATYPES)}"
        )
    return _DATATYPES[name]


def dtype_of(datatype: str) -> np.dtype:
    """NumPy dtype of a KServe v2 datatype name (`BF16` -> ml_dtypes.bfloat16)."""
    if datatype == "BF16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_DTYPES[datatype])


def is_datatype(datatype: Any) -> bool:
    return isinstance(datatype, str) and datatype in _DTYPES


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_file(path: Path, data: bytes) -> None:
    """Write and fsync, so that the later rename publishes bytes that are really on disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_json(path: Path, obj: Any) -> None:
    write_file(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def write_manifest(directory: Path) -> dict[str, Any]:
    files = {
        name: {"sha256": sha256_file(directory / name), "bytes": (directory / name).stat().st_size}
        for name in CONTENT_FILES
    }
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "files": files}
    write_json(directory / MANIFEST_FILE, manifest)
    return manifest


def verify_manifest(directory: Path, *, check_hashes: bool = True) -> dict[str, Any]:
    """Check that every file the manifest lists is present, whole and unchanged.

    Raises ArtifactError naming the first bad file and what to do about it.
    """
    manifest_path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise ArtifactError(f"artifact directory {str(directory)!r} does not exist")
    if not manifest_path.is_file():
        raise ArtifactError(
            f"{str(directory)!r} is a partial artifact: {MANIFEST_FILE} is missing (the export "
            "or copy did not finish); re-export it with jaxstack.serving.export"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{str(manifest_path)!r} is not valid JSON ({e}); re-export") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{str(manifest_path)!r} is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{str(manifest_path)!r} has format_version {manifest.get('format_version')!r}; "
            f"this jaxstack-serving reads version {FORMAT_VERSION}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != set(CONTENT_FILES):
        raise ArtifactError(
            f"{str(manifest_path)!r} must list exactly {list(CONTENT_FILES)}, "
            f"found {sorted(files) if isinstance(files, dict) else files!r}"
        )
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise ArtifactError(
                f"{str(directory)!r} is a partial artifact: {name} is missing; re-export it"
            )
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise ArtifactError(
                f"{str(path)!r} has {size} bytes but the manifest records {entry.get('bytes')}: "
                "the file is truncated or was modified; re-export the artifact"
            )
        if check_hashes and sha256_file(path) != entry.get("sha256"):
            raise ArtifactError(
                f"{str(path)!r} does not match its sha256 in {MANIFEST_FILE}: the file is "
                "corrupted or was tampered with; re-export the artifact"
            )
    return manifest
