"""`export`: turn a JAX function and its parameters into a versioned, self-checking artifact.

The function is wrapped so that the exported computation has one calling convention whatever
the user's PyTree shapes were: `(weights: {path: array}, inputs: {name: array}) -> {name: array}`.
The parameter tree's structure is closed over at export time, so a loader needs no Python code
of the model, only `jax.export.deserialize` and the safetensors file.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax import export as jax_export
from safetensors.numpy import save as safetensors_save

from jaxstack.serving._src.errors import ExportError
from jaxstack.serving._src.models import artifact_format as fmt


def leaf_path(key_path: Sequence[Any]) -> str:
    """The project's parameter path of a PyTree key path (`layers/3/attn/q_proj/kernel`).

    JAX's own `keystr`, `/`-separated, after dropping a final `.value` attribute (the Flax NNX
    Variable wrapper); a dict key named "value" is a real name and stays.
    """
    key_path = tuple(key_path)
    last = key_path[-1] if key_path else None
    if isinstance(last, jax.tree_util.GetAttrKey) and last.name == "value":
        key_path = key_path[:-1]
    return jax.tree_util.keystr(key_path, simple=True, separator="/")


def _flatten_params(params: Any) -> tuple[list[str], Any, dict[str, np.ndarray]]:
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths = [leaf_path(kp) for kp, _ in leaves_with_path]
    if len(set(paths)) != len(paths):
        dupes = sorted({p for p in paths if paths.count(p) > 1})
        raise ExportError(f"params has leaves whose '/'-joined paths collide: {dupes}")
    weights = {}
    for path, (_, leaf) in zip(paths, leaves_with_path, strict=True):
        array = np.asarray(leaf)
        if array.dtype == object:
            raise ExportError(f"params leaf {path!r} is not an array (got {type(leaf).__name__})")
        fmt.datatype_of(array.dtype)
        weights[path] = np.ascontiguousarray(array)
    return paths, treedef, weights


def _input_specs(example_inputs: Any) -> tuple[str, dict[str, jax.ShapeDtypeStruct]]:
    """Name the inputs and return (call style, {name: example spec})."""
    if isinstance(example_inputs, Mapping):
        style, named = "keywords", dict(example_inputs)
    elif isinstance(example_inputs, list | tuple):
        style, named = "positional", {f"input_{i}": x for i, x in enumerate(example_inputs)}
    else:
        style, named = "single", {"input": example_inputs}
    if not named:
        raise ExportError("example_inputs is empty; pass at least one batched example array")
    specs = {}
    for name, x in named.items():
        if not isinstance(name, str) or not fmt.NAME_PATTERN.fullmatch(name):
            raise ExportError(f"input name {name!r} must match {fmt.NAME_PATTERN.pattern}")
        shape, dtype = tuple(np.shape(x)), np.dtype(getattr(x, "dtype", np.asarray(x).dtype))
        if len(shape) == 0:
            raise ExportError(
                f"example input {name!r} is a scalar; every input needs a leading batch dimension"
            )
        fmt.datatype_of(dtype)
        specs[name] = jax.ShapeDtypeStruct(shape, dtype)
    return style, specs


def _named_outputs(out: Any, output_names: Sequence[str] | None) -> dict[str, Any]:
    if isinstance(out, Mapping):
        named = dict(out)
    elif isinstance(out, list | tuple):
        named = {f"output_{i}": x for i, x in enumerate(out)}
    else:
        named = {"output_0": out}
    if output_names is not None:
        if len(output_names) != len(named):
            raise ExportError(
                f"output_names has {len(output_names)} names but fn returns {len(named)} outputs"
            )
        named = dict(zip(output_names, named.values(), strict=True))
    return named


def export(
    fn: Callable[..., Any],
    params: Any,
    example_inputs: Any,
    *,
    name: str,
    version: int,
    repository: str | os.PathLike[str],
    output_names: Sequence[str] | None = None,
    platforms: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Export `fn(params, ...)` as the artifact `<repository>/<name>/<version>/`.

    Args:
      fn: a pure JAX function of the parameters and the inputs. With `example_inputs` a dict it
        is called `fn(params, **inputs)`, a tuple/list `fn(params, *inputs)`, an array
        `fn(params, x)`. It returns an array, a tuple/list or a dict of arrays, each with the
        batch dimension first.
      params: a PyTree of arrays; stored as safetensors under `/`-joined leaf paths.
      example_inputs: arrays or `jax.ShapeDtypeStruct`s fixing each input's dtype and trailing
        shape; the leading dimension is exported as the symbolic `batch`.
      name: model name (letters, digits, `_.-`).
      version: a positive integer; versions are immutable, an existing one is never replaced.
      repository: the model repository root.
      output_names: names for tuple/array outputs (default `output_0`, `output_1`, ...).
      platforms: lowering platforms (`"cpu"`, `"cuda"`, `"rocm"`, `"tpu"`); default the current
        backend. Export for several to serve one artifact on each.
      metadata: extra JSON-serialisable facts stored in `metadata.json` under `user`.

    Returns:
      The artifact directory. It appears whole or not at all: the files are written to a hidden
      temporary directory beside it, hashed into `manifest.json`, then renamed into place.

    Example:
      >>> export(mlp, params, {"x": np.zeros((1, 784), np.float32)},
      ...        name="mnist", version=1, repository="models")  # doctest: +SKIP
    """
    _check_name_and_version(name, version)
    paths, treedef, weights = _flatten_params(params)
    style, specs = _input_specs(example_inputs)

    def serving_fn(w: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
        p = jax.tree_util.tree_unflatten(treedef, [w[k] for k in paths])
        if style == "keywords":
            out = fn(p, **{k: inputs[k] for k in specs})
        else:
            out = fn(p, *[inputs[k] for k in specs])
        return _named_outputs(out, output_names)

    (batch,) = jax_export.symbolic_shape(fmt.BATCH_DIM)
    input_specs = {
        k: jax.ShapeDtypeStruct((batch, *s.shape[1:]), s.dtype) for k, s in specs.items()
    }
    exported = _export_stablehlo(fn, serving_fn, weights, input_specs, platforms)
    signature = {
        "batch_dim": fmt.BATCH_DIM,
        "inputs": [_tensor_entry(k, s.dtype, s.shape) for k, s in input_specs.items()],
        "outputs": _output_entries(exported),
        "weights": [_tensor_entry(k, v.dtype, v.shape) for k, v in weights.items()],
    }
    return _write_atomically(
        Path(repository) / name,
        str(version),
        {
            fmt.MODEL_FILE: bytes(exported.serialize()),
            fmt.WEIGHTS_FILE: safetensors_save(weights, metadata={"format": fmt.FORMAT}),
        },
        {
            fmt.SIGNATURE_FILE: signature,
            fmt.METADATA_FILE: _metadata(name, version, exported, metadata),
        },
    )


def _check_name_and_version(name: Any, version: Any) -> None:
    if not isinstance(name, str) or not fmt.NAME_PATTERN.fullmatch(name):
        raise ExportError(f"name {name!r} must match {fmt.NAME_PATTERN.pattern}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ExportError(f"version {version!r} must be a positive integer")


def _export_stablehlo(
    fn: Callable[..., Any],
    serving_fn: Callable[..., Any],
    weights: dict[str, np.ndarray],
    input_specs: dict[str, jax.ShapeDtypeStruct],
    platforms: Sequence[str] | None,
) -> jax_export.Exported:
    """`jax.export` of the serving function, its batch dimension symbolic."""
    weight_specs = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in weights.items()}
    try:
        return jax_export.export(
            jax.jit(serving_fn), platforms=None if platforms is None else tuple(platforms)
        )(weight_specs, input_specs)
    except Exception as e:
        raise ExportError(
            f"jax.export of {getattr(fn, '__name__', fn)!r} with a symbolic batch dimension "
            f"failed: {e}. The function must work for any batch size (no Python branches on "
            "the batch size, reshape with -1 rather than the concrete batch)"
        ) from e


def _output_entries(exported: jax_export.Exported) -> list[dict[str, Any]]:
    """The signature's outputs: named, and each with the batch dimension leading."""
    out_tree = exported.out_tree.unflatten(list(exported.out_avals))
    outputs = []
    for out_name, aval in out_tree.items():
        if not isinstance(out_name, str) or not fmt.NAME_PATTERN.fullmatch(out_name):
            raise ExportError(f"output name {out_name!r} must match {fmt.NAME_PATTERN.pattern}")
        if not aval.shape or str(aval.shape[0]) != fmt.BATCH_DIM:
            raise ExportError(
                f"output {out_name!r} has shape {aval.shape} without the batch dimension first; "
                "serving splits every output along axis 0, so keep the batch dimension leading"
            )
        outputs.append(_tensor_entry(out_name, aval.dtype, aval.shape))
    return outputs


def _metadata(
    name: str, version: int, exported: jax_export.Exported, user: Mapping[str, Any] | None
) -> dict[str, Any]:
    return {
        "name": name,
        "version": version,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax_version": jax.__version__,
        "jaxlib_version": importlib.metadata.version("jaxlib"),
        "jaxstack_serving_version": importlib.metadata.version("jaxstack-serving"),
        "platforms": list(exported.platforms),
        "calling_convention_version": exported.calling_convention_version,
        "user": dict(user or {}),
    }


def _tensor_entry(name: str, dtype: Any, shape: Sequence[Any]) -> dict[str, Any]:
    dims = [-1 if str(d) == fmt.BATCH_DIM else int(d) for d in shape]
    return {"name": name, "datatype": fmt.datatype_of(dtype), "shape": dims}


def _write_atomically(
    model_dir: Path, version: str, blobs: dict[str, bytes], docs: dict[str, Any]
) -> Path:
    final = model_dir / version
    if final.exists():
        raise ExportError(
            f"{str(final)!r} already exists; versions are immutable, export a new version number"
        )
    model_dir.mkdir(parents=True, exist_ok=True)
    # A leading dot keeps the repository poller from ever looking at an unfinished directory.
    tmp = model_dir / f".tmp-{version}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for file_name, data in blobs.items():
            fmt.write_file(tmp / file_name, data)
        for file_name, doc in docs.items():
            fmt.write_json(tmp / file_name, doc)
        fmt.write_manifest(tmp)
        try:
            os.rename(tmp, final)
        except OSError as e:
            raise ExportError(f"could not publish {str(final)!r}: {e}") from e
        _fsync_dir(model_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
