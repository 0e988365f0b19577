"""safetensors files through the `safetensors` library (NumPy API; bfloat16 via ml_dtypes).

Reading opens a file lazily (`safe_open`): headers give names and shapes without touching the
data, and each tensor is read when asked for, so loading a checkpoint never holds more than the
tensor being converted plus the model. Writing is atomic.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Mapping

import numpy as np
import safetensors
import safetensors.numpy

from jaxstack.nnlib._src.errors import Error


def open_safetensors(path: str | os.PathLike) -> safetensors.safe_open:
    """A lazy NumPy view of one .safetensors file (`keys`, `get_slice`, `get_tensor`)."""
    try:
        return safetensors.safe_open(str(path), framework="numpy")
    except (OSError, safetensors.SafetensorError) as e:
        raise Error(f"{path}: not a readable safetensors file ({e})") from e


def umask_mode(mode: int) -> int:
    """`mode` as the umask lets `open` and `mkdir` create it: tempfile's files and folders (and
    safetensors' own) are private (0600, 0700), so a file renamed into place gets this mode."""
    mask = os.umask(0o022)  # reading the umask means setting it: set back at once
    os.umask(mask)
    return mode & ~mask


def save_safetensors(
    tensors: Mapping[str, np.ndarray],
    path: str | os.PathLike,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `tensors` to `path` atomically: a unique temporary file beside it, then a rename,
    so a crash or a full disk leaves the old file or the new one, never half of one. The file
    gets the umask's permissions, as `open` would give it."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        safetensors.numpy.save_file(
            {name: np.ascontiguousarray(a) for name, a in tensors.items()},
            tmp,
            metadata=dict(metadata or {"format": "pt"}),
        )
        os.chmod(tmp, umask_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
