"""Parameters to and from safetensors files, with a name-mapping hook.

safetensors is a flat {name: tensor} format with a JSON header: no code runs on load, and
Hugging Face tools read it. Names default to the leaf paths of the project's convention
(paths.py: an nnx.Variable's final `value` is not part of the name); `name_map` translates them
(e.g. nnlib's `layers/3/attn/q_proj/kernel` <-> HF's `model.layers.3.self_attn.q_proj.weight`).
A map may also drop a tensor by returning None.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from jaxstack.ckptlib._src import layout, multihost, paths, tree
from jaxstack.ckptlib._src.errors import CheckpointNotFoundError, Error

NameMap = Callable[[str], str | None] | Mapping[str, str] | None


def _mapper(name_map: NameMap) -> Callable[[str], str | None]:
    if name_map is None:
        return lambda name: name
    if isinstance(name_map, Mapping):
        return lambda name: name_map.get(name, name)
    return name_map


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x), order="C")  # (ascontiguousarray makes 0-d 1-d)


def save_safetensors(
    params: Any,
    path: str | os.PathLike[str],
    *,
    name_map: NameMap = None,
    metadata: Mapping[str, str] | None = None,
) -> list[str]:
    """Write every leaf of `params` to one safetensors file (atomically); returns the names.

    Args:
      params: a PyTree of arrays (nested dicts, nnx.State, ...).
      path: the output file.
      name_map: `/`-path -> tensor name (callable or dict); a callable may return None to skip.
      metadata: string key/values stored in the file header.
    """
    mapper = _mapper(name_map)
    tensors: dict[str, np.ndarray] = {}
    for keys, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = mapper(paths.path_str(keys))
        if name is None:
            continue
        if name in tensors:
            raise Error(f"name_map maps two leaves to {name!r}; make the mapping one-to-one")
        tensors[name] = _to_numpy(leaf)
    if not tensors:
        raise Error("nothing to write: params has no leaves (or name_map dropped them all)")
    out = Path(os.fspath(path))
    if multihost.is_primary():
        out.parent.mkdir(parents=True, exist_ok=True)
        with layout.atomic_file(out) as tmp:
            save_file(tensors, str(tmp), metadata=dict(metadata) if metadata else None)
    return sorted(tensors)


def load_safetensors(
    path: str | os.PathLike[str], *, name_map: NameMap = None, flat: bool = False
) -> dict[str, Any]:
    """Read a safetensors file into NumPy arrays.

    Args:
      path: the file.
      name_map: tensor name -> `/`-path (callable or dict); a callable may return None to skip.
      flat: return {name: array}; by default names are split at `/` into nested dicts, so
        mapped names come back in the params tree's own layout.
    """
    p = Path(os.fspath(path))
    if not p.is_file():
        raise CheckpointNotFoundError(f"safetensors file {p} does not exist")
    mapper = _mapper(name_map)
    out: dict[str, Any] = {}
    for name, array in load_file(str(p)).items():
        mapped = mapper(name)
        if mapped is None:
            continue
        if mapped in out:
            raise Error(f"name_map maps two tensors to {mapped!r}; make the mapping one-to-one")
        out[mapped] = array
    if flat:
        return out
    return tree.nest([tuple(n.split("/")) for n in out], list(out.values()))
