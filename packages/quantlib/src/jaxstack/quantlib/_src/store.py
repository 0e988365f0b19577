"""A quantised model on disk: a ckptlib checkpoint plus an HF-style safetensors export.

    DIR/quant.json          rules, nnlib model config, tokenizer, sequence length, source
    DIR/checkpoint/         ckptlib checkpoint {"model": nnx.state(model)}: int codes stay int
    DIR/model.safetensors   every tensor by name; quantised weights as `<module>.weight` codes
                            with `<module>.weight_scale` (and `.input_scale` for static
                            activation scales), the layout in the `quantization_config` header

The directory is written under a temporary name and renamed into place, so a failure leaves
nothing behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import uuid
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxstack import ckptlib, nnlib
from jaxstack.quantlib._src.errors import SourceError
from jaxstack.quantlib._src.intercept import QuantizedWeight
from jaxstack.quantlib._src.quantize import PtqProvider, quantized_structure
from jaxstack.quantlib._src.rules import QuantRule, rules_from_dicts

FORMAT = "jaxstack-quantlib"
INFO_FILE = "quant.json"


def _tensor_name(path: str) -> str:
    parts = path.split("/")
    if parts[-3:-1] == ["kernel", "value"]:
        suffix = {"values": "weight", "scales": "weight_scale", "zero_points": "weight_zero_point"}
        return ".".join([*parts[:-3], suffix[parts[-1]]])
    if parts[-1] == "act_scale":
        return ".".join([*parts[:-1], "input_scale"])
    return ".".join(parts)


def export_safetensors(
    model: nnx.Module, path: str | os.PathLike[str], rules: Sequence[QuantRule]
) -> list[str]:
    """Write the model's state to one safetensors file (HF-style names, scales beside codes).

    The header's `quantization_config` (JSON) holds the rules and, per quantised weight, its
    qtype, dense shape and dtype, contracted axes and tile size, which is what a reader needs
    to dequantise: `weight` holds [K, N] codes (4-bit formats: [K/2, N] bytes, row 2i in the
    low nibble; fp8 formats: the float8 bit patterns as uint8, since safetensors' NumPy reader
    has no float8), `weight_scale` [K // tile, N].
    """
    layout = {}
    for module_path, var in _quantized_weights(model):
        qt = var.get_value()
        layout[f"{module_path.replace('/', '.')}.weight"] = {
            "qtype": qt.qtype,
            "shape": list(qt.shape),
            "dtype": np.dtype(qt.dtype).name,
            "contract_ndim": qt.contract_ndim,
            "tile_size": qt.tile_size,
        }
    tensors = {}
    for keys, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]:
        if keys[-1] == jax.tree_util.GetAttrKey("value"):
            keys = keys[:-1]
        array = np.asarray(leaf)
        if "float8" in array.dtype.name:
            array = array.view(np.uint8)
        tensors[_tensor_name(jax.tree_util.keystr(keys, simple=True, separator="/"))] = array
    config = {"format": FORMAT, "rules": [r.to_dict() for r in rules], "weights": layout}
    return ckptlib.save_safetensors(
        tensors, path, metadata={"format": FORMAT, "quantization_config": json.dumps(config)}
    )


def _quantized_weights(model: nnx.Module) -> list[tuple[str, QuantizedWeight]]:
    out = []
    for path, node in nnx.iter_graph(model):
        if isinstance(node, QuantizedWeight):
            out.append(("/".join(str(k) for k in path[:-1]), node))
    return out


def save_quantized(
    model: nnx.Module,
    directory: str | os.PathLike[str],
    *,
    rules: Sequence[QuantRule],
    model_config: nnlib.ModelConfig,
    info: dict[str, Any],
    step: int = 0,
) -> pathlib.Path:
    """Write a quantised nnlib model to a new `directory` (see the module docstring)."""
    out = pathlib.Path(directory)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SourceError(f"{out} already exists; choose a new output directory")
    record = {
        "format": FORMAT,
        "rules": [r.to_dict() for r in rules],
        "model_config": model_config.to_dict(),
        **info,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        with ckptlib.CheckpointManager(tmp / "checkpoint", async_save=False) as manager:
            manager.save(step, {"model": nnx.state(model)}, metadata=record)
        export_safetensors(model, tmp / "model.safetensors", rules)
        (tmp / INFO_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_info(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = pathlib.Path(directory) / INFO_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SourceError(
            f"{directory}: no readable {INFO_FILE}; pass a directory written by "
            "`jaxstack-quant ptq`"
        ) from e
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = (
            f"format {record.get('format')!r}"
            if isinstance(record, dict)
            else f"a JSON {type(record).__name__}"
        )
        raise SourceError(
            f"{path}: {found}, not a {FORMAT!r} record; pass a directory written by "
            "`jaxstack-quant ptq`"
        )
    missing = sorted({"rules", "model_config"} - set(record))
    if missing:
        raise SourceError(
            f"{path}: lacks {missing}; pass a directory written by `jaxstack-quant ptq`"
        )
    return record


def load_quantized(directory: str | os.PathLike[str]) -> tuple[nnx.Module, dict[str, Any]]:
    """The quantised model saved by `save_quantized`, and its `quant.json` record."""
    record = read_info(directory)
    rules = rules_from_dicts(record["rules"], f"{directory}/{INFO_FILE}")
    try:
        mcfg = nnlib.ModelConfig.from_dict(record["model_config"])
    except (nnlib.Error, TypeError, ValueError) as e:
        raise SourceError(f"{directory}/{INFO_FILE}: model_config does not build ({e})") from e
    model = nnx.eval_shape(
        lambda: quantized_structure(nnlib.Transformer(mcfg, rngs=nnx.Rngs(0)), PtqProvider(rules))
    )
    try:
        with ckptlib.CheckpointManager(
            pathlib.Path(directory) / "checkpoint", read_only=True, create=False
        ) as manager:
            restored = manager.restore(target={"model": nnx.state(model)})
    except ckptlib.Error as e:
        raise SourceError(f"{directory}: {e}") from e
    nnx.update(model, restored.state["model"])
    return model, record
