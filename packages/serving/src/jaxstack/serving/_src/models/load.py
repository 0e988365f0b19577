"""`load_artifact`: read an exported artifact back, refusing anything partial or tampered with.

Loading needs only jax, numpy and safetensors: the manifest is checked first (every file present,
of the recorded size and sha256), then the StableHLO is deserialised and the weights are put on
the default device once. Calls are jitted per concrete batch size.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax import export as jax_export
from safetensors import SafetensorError
from safetensors.numpy import load_file as safetensors_load_file

from jaxstack.serving._src.errors import ArtifactError
from jaxstack.serving._src.models import artifact_format as fmt


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, KServe datatype and shape (-1 = the batch dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return fmt.dtype_of(self.datatype)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Signature:
    """The inputs and outputs of an exported model (its `signature.json`), as `TensorSpec`s in
    call order; a request must give every input by name."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Signature:
        def specs(key: str) -> tuple[TensorSpec, ...]:
            return tuple(
                TensorSpec(e["name"], e["datatype"], tuple(int(s) for s in e["shape"]))
                for e in d[key]
            )

        return cls(specs("inputs"), specs("outputs"))


class Artifact:
    """A loaded model version: call it with `{input name: array}` to get `{output name: array}`.

    Attributes:
      name, version: from `metadata.json`.
      signature: the inputs and outputs (`Signature`).
      metadata: the whole `metadata.json`.
      path: the artifact directory.
    """

    def __init__(
        self,
        path: Path,
        exported: Any,
        weights: dict[str, Any],
        signature: Signature,
        metadata: dict[str, Any],
    ):
        self.path = path
        self.exported = exported
        self.weights = weights
        self.signature = signature
        self.metadata = metadata
        self.name: str = metadata["name"]
        self.version: int = int(metadata["version"])
        self._call = jax.jit(exported.call)

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, jax.Array]:
        """Run the computation on a batch; every input must have the same leading size."""
        return self._call(self.weights, {s.name: inputs[s.name] for s in self.signature.inputs})

    def call_numpy(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in jax.device_get(self(inputs)).items()}

    def warm_up(self, batch_sizes: Iterable[int]) -> None:
        """Compile (and run once) every batch size, so no request pays for compilation."""
        for size in batch_sizes:
            zeros = {s.name: np.zeros((size, *s.shape[1:]), s.dtype) for s in self.signature.inputs}
            jax.block_until_ready(self(zeros))


def load_artifact(path: str | os.PathLike[str], *, verify: bool = True) -> Artifact:
    """Load the artifact directory `path` (`<repository>/<model>/<version>`).

    Args:
      path: the artifact directory.
      verify: check every file's sha256 against the manifest (sizes are always checked).

    Raises:
      ArtifactError: the artifact is partial, corrupted, tampered with, or was exported for
        platforms other than the current backend.
    """
    directory = Path(path)
    fmt.verify_manifest(directory, check_hashes=verify)
    try:
        signature_doc = json.loads((directory / fmt.SIGNATURE_FILE).read_text())
        metadata = json.loads((directory / fmt.METADATA_FILE).read_text())
        signature = Signature.from_dict(signature_doc)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{str(directory)!r} has a malformed signature or metadata: {e}") from e
    _check_platform(directory, metadata.get("platforms", []))
    try:
        exported = jax_export.deserialize(bytearray((directory / fmt.MODEL_FILE).read_bytes()))
    except Exception as e:
        raise ArtifactError(
            f"{str(directory / fmt.MODEL_FILE)!r} is not a StableHLO export this jax "
            f"({jax.__version__}) can read: {e}"
        ) from e
    try:
        arrays = safetensors_load_file(directory / fmt.WEIGHTS_FILE)
    except SafetensorError as e:
        raise ArtifactError(f"{str(directory / fmt.WEIGHTS_FILE)!r} is unreadable: {e}") from e
    expected = {e["name"]: e for e in signature_doc.get("weights", [])}
    if set(arrays) != set(expected):
        raise ArtifactError(
            f"{str(directory / fmt.WEIGHTS_FILE)!r} holds {sorted(arrays)} but the signature "
            f"lists {sorted(expected)}; re-export the artifact"
        )
    weights = {k: jax.device_put(v) for k, v in arrays.items()}
    return Artifact(directory, exported, weights, signature, metadata)


def _check_platform(directory: Path, platforms: list[str]) -> None:
    backend = jax.default_backend()
    accepted = {"gpu": {"cuda", "rocm"}}.get(backend, {backend})
    if not accepted & set(platforms):
        raise ArtifactError(
            f"{str(directory)!r} was exported for {platforms} but this process runs on "
            f"{backend!r}; re-export with platforms=[..., {sorted(accepted)[0]!r}]"
        )
