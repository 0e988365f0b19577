"""KServe v2 (Open Inference Protocol) JSON tensors: decode requests, encode responses.

A tensor is `{"name", "shape", "datatype", "data"}` with `data` the row-major flattened values
(nested lists are accepted too). Decoding checks only what the request says about itself
(well-formed, data matching shape and datatype); whether it fits the model is the server's
`validate_inputs`. Every error names the offending field, e.g. `inputs[1].shape`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from jaxstack.serving._src.errors import InvalidInputError
from jaxstack.serving._src.models import artifact_format as fmt


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None


def decode_request(body: bytes) -> InferRequest:
    try:
        # orjson: the float-heavy bodies of tensor requests parse several times faster than
        # with the json module, and parsing is the one per-request cost batching cannot share.
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidInputError(f"request body is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise InvalidInputError("request body must be a JSON object with an 'inputs' list")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInputError(f"id must be a string, got {type(request_id).__name__}")
    tensors = doc.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise InvalidInputError("inputs must be a non-empty list of tensors")
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(tensors):
        name, array = _decode_tensor(i, tensor)
        if name in inputs:
            raise InvalidInputError(f"inputs[{i}].name {name!r} appears twice")
        inputs[name] = array
    outputs = None
    if doc.get("outputs") is not None:
        requested = doc["outputs"]
        if not isinstance(requested, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in requested
        ):
            raise InvalidInputError('outputs must be a list of {"name": ...} objects')
        outputs = [o["name"] for o in requested]
    return InferRequest(request_id, inputs, outputs)


def _decode_tensor(i: int, tensor: Any) -> tuple[str, np.ndarray]:
    field = f"inputs[{i}]"
    if not isinstance(tensor, dict):
        raise InvalidInputError(f"{field} must be an object with name, shape, datatype, data")
    for key in ("name", "shape", "datatype", "data"):
        if key not in tensor:
            raise InvalidInputError(f"{field}.{key} is missing")
    name, shape, datatype, data = (tensor[k] for k in ("name", "shape", "datatype", "data"))
    if not isinstance(name, str):
        raise InvalidInputError(f"{field}.name must be a string")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidInputError(f"{field}.shape must be a list of non-negative integers: {shape!r}")
    if not fmt.is_datatype(datatype):
        raise InvalidInputError(f"{field}.datatype {datatype!r} is not supported")
    if isinstance(tensor.get("parameters"), dict) and "binary_data_size" in tensor["parameters"]:
        raise InvalidInputError(
            f"{field}: binary tensor data is not supported; send the tensor as JSON 'data'"
        )
    dtype = fmt.dtype_of(datatype)
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise InvalidInputError(f"{field}.data is not a (nested) list of numbers: {e}") from e
    if raw.dtype.kind in "iuf" and _holds_a_bool(data):
        # NumPy would read [0.5, true] as [0.5, 1.0]: a client bug, not a number.
        raise InvalidInputError(
            f"{field}.data mixes booleans and numbers; send only {datatype} values"
        )
    if raw.size and (
        raw.dtype.kind not in "biuf"
        or (dtype.kind in "iu" and raw.dtype.kind == "f")
        or ((dtype.kind == "b") != (raw.dtype.kind == "b"))
    ):
        raise InvalidInputError(
            f"{field}.data holds {raw.dtype.name} values, which are not {datatype} values"
        )
    expected = math.prod(shape)
    if raw.size != expected:
        raise InvalidInputError(
            f"{field}.data has {raw.size} elements but {field}.shape {shape} needs {expected}"
        )
    try:
        with np.errstate(over="raise", invalid="raise"):
            array = raw.astype(dtype).reshape(shape)
    except (OverflowError, FloatingPointError, ValueError) as e:
        raise InvalidInputError(f"{field}.data does not fit {datatype}: {e}") from e
    if dtype.kind in "iu" and not np.array_equal(array, raw.reshape(shape)):
        raise InvalidInputError(f"{field}.data has values out of the range of {datatype}")
    return name, array


def _holds_a_bool(data: Any) -> bool:
    """Whether a (nested) JSON list has a boolean anywhere among its leaves."""
    if isinstance(data, list):
        return any(_holds_a_bool(x) for x in data)
    return isinstance(data, bool)


def encode_response(
    model: str,
    version: int,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    requested: Sequence[str] | None,
) -> bytes:
    if requested is not None:
        unknown = [n for n in requested if n not in outputs]
        if unknown:
            raise InvalidInputError(
                f"outputs {unknown} are not outputs of this model; expected {sorted(outputs)}"
            )
    names = list(outputs) if requested is None else list(requested)
    doc: dict[str, Any] = {
        "model_name": model,
        "model_version": str(version),
        "outputs": [_encode_tensor(n, outputs[n]) for n in names],
    }
    if request_id is not None:
        doc["id"] = request_id
    # Strict JSON: NaN and infinities (which JSON cannot spell) are sent as null.
    return orjson.dumps(doc)


def _encode_tensor(name: str, array: np.ndarray) -> dict[str, Any]:
    datatype = fmt.datatype_of(array.dtype)
    values = array.astype(np.float32) if datatype in ("BF16", "FP16") else array
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "data": values.reshape(-1).tolist(),
    }
