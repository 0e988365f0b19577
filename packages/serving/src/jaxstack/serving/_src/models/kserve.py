"""KServe v2 (Open Inference Protocol) tensors: decode requests, encode responses.

A tensor is `{"name", "shape", "datatype", "data"}` with `data` the row-major flattened values
(nested lists are accepted too), read in bounded memory by `json_tensors`. The binary tensor
data extension (Triton's, which tritonclient uses with `binary_data=True`) is supported both
ways: when the request's `Inference-Header-Content-Length` header says the JSON is only the
body's first N bytes, an input with `parameters.binary_data_size` takes its values from the raw
little-endian bytes after the JSON, in the order of the inputs; an output is returned the same
way when the request asks for it (`binary_data: true` on the output, or
`parameters.binary_data_output: true` on the request for every output not saying otherwise).

Decoding checks only what the request says about itself (well-formed, data matching shape and
datatype); whether it fits the model is the server's `validate_inputs`. Every error names the
offending field, e.g. `inputs[1].shape`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from jaxstack.serving._src.errors import InvalidInputError
from jaxstack.serving._src.models import artifact_format as fmt
from jaxstack.serving._src.models import json_tensors

# The request header of the binary extension: the JSON is the body's first N bytes.
BINARY_HEADER = "Inference-Header-Content-Length"


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None
    # Output name -> binary or not, where the request says so per output.
    binary: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False

    def wants_binary(self, output: str) -> bool:
        return self.binary.get(output, self.binary_default)


@dataclass
class _BinaryData:
    """The bytes after the JSON header, handed out to the inputs in their order."""

    data: memoryview
    used: int = 0

    def take(self, size: int, field: str) -> memoryview:
        if self.used + size > len(self.data):
            raise InvalidInputError(
                f"{field}.parameters.binary_data_size {size} goes past the end of the body: "
                f"{len(self.data)} bytes follow the JSON header and the inputs before it "
                f"took {self.used}"
            )
        self.used += size
        return self.data[self.used - size : self.used]


def decode_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """The request in `body`; `header_length` is the binary extension's header value, if sent."""
    binary = None
    if header_length is not None:
        if not 0 < header_length <= len(body):
            raise InvalidInputError(
                f"{BINARY_HEADER} {header_length} must be between 1 and the body's length "
                f"({len(body)} bytes): it gives the length of the JSON part"
            )
        binary = _BinaryData(memoryview(body)[header_length:])
        body = body[:header_length]
    skeleton, spans = json_tensors.split_body(body)
    try:
        # orjson: several times faster than the json module; the data arrays, the only big
        # part, were taken out by split_body and are read a slice at a time.
        doc = orjson.loads(skeleton)
    except orjson.JSONDecodeError as e:
        hint = ""
        if binary is None and "after document" in str(e):
            hint = (
                f"; if tensor bytes follow the JSON, send its length in the {BINARY_HEADER} header"
            )
        raise InvalidInputError(f"request body is not valid JSON: {e}{hint}") from e
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
        name, array = _decode_tensor(i, tensor, spans.get(i), binary)
        if name in inputs:
            raise InvalidInputError(f"inputs[{i}].name {name!r} appears twice")
        inputs[name] = array
    if binary is not None and binary.used != len(binary.data):
        raise InvalidInputError(
            f"{len(binary.data)} bytes follow the JSON header but the inputs' "
            f"parameters.binary_data_size add up to {binary.used}"
        )
    request = InferRequest(request_id, inputs, None)
    request.binary_default = _flag(doc, "binary_data_output", "")
    if doc.get("outputs") is not None:
        requested = doc["outputs"]
        if not isinstance(requested, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in requested
        ):
            raise InvalidInputError('outputs must be a list of {"name": ...} objects')
        request.outputs = [o["name"] for o in requested]
        for i, output in enumerate(requested):
            if "classification" in _parameters(output, f"outputs[{i}]"):
                raise InvalidInputError(
                    f"outputs[{i}].parameters.classification is not supported; ask for the "
                    "output itself and rank it on the client"
                )
            if "binary_data" in _parameters(output, f"outputs[{i}]"):
                request.binary[output["name"]] = _flag(output, "binary_data", f"outputs[{i}]")
    return request


def _parameters(owner: dict, where: str) -> dict:
    """`owner`'s parameters object; `where` names the owner in messages ("" for the request)."""
    parameters = owner.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInputError(f"{where + '.' if where else ''}parameters must be an object")
    return parameters


def _flag(owner: dict, name: str, where: str) -> bool:
    value = _parameters(owner, where).get(name, False)
    if not isinstance(value, bool):
        field = f"{where + '.' if where else ''}parameters.{name}"
        raise InvalidInputError(f"{field} must be true or false, got {value!r}")
    return value


def _decode_tensor(
    i: int, tensor: Any, span: json_tensors.Span | None, binary: _BinaryData | None
) -> tuple[str, np.ndarray]:
    field = f"inputs[{i}]"
    if not isinstance(tensor, dict):
        raise InvalidInputError(f"{field} must be an object with name, shape, datatype, data")
    for key in ("name", "shape", "datatype"):
        if key not in tensor:
            raise InvalidInputError(f"{field}.{key} is missing")
    name, shape, datatype = tensor["name"], tensor["shape"], tensor["datatype"]
    if not isinstance(name, str):
        raise InvalidInputError(f"{field}.name must be a string")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidInputError(f"{field}.shape must be a list of non-negative integers: {shape!r}")
    if not fmt.is_datatype(datatype):
        raise InvalidInputError(f"{field}.datatype {datatype!r} is not supported")
    dtype = np.dtype(fmt.dtype_of(datatype))
    if "binary_data_size" in _parameters(tensor, field):
        return name, _binary_tensor(tensor, field, shape, dtype, binary)
    if "data" not in tensor:
        raise InvalidInputError(
            f"{field}.data is missing (or send the values as binary data: "
            f"parameters.binary_data_size and the {BINARY_HEADER} header)"
        )
    if span is None:
        raise InvalidInputError(
            f"{field}.data must be a list of values, got {tensor['data']!r:.40}"
        )
    return name, json_tensors.read_data(span, shape, dtype, field, datatype)


def _binary_tensor(
    tensor: dict, field: str, shape: list[int], dtype: np.dtype, binary: _BinaryData | None
) -> np.ndarray:
    size = tensor["parameters"]["binary_data_size"]
    where = f"{field}.parameters.binary_data_size"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInputError(f"{where} must be a non-negative integer, got {size!r}")
    if binary is None:
        raise InvalidInputError(
            f"{where} is given but the request has no {BINARY_HEADER} header: send the length "
            "of the JSON part in it, the tensor bytes after the JSON"
        )
    if "data" in tensor:
        raise InvalidInputError(f"{field} has both data and binary_data_size; send one of them")
    needed = math.prod(shape) * dtype.itemsize
    if size != needed:
        raise InvalidInputError(
            f"{where} is {size} but shape {shape} of {tensor['datatype']} needs {needed} bytes"
        )
    array = np.frombuffer(binary.take(size, field), dtype=dtype)
    if sys.byteorder != "little":  # the extension's byte order is little-endian
        array = array.byteswap()
    if dtype.kind == "b" and array.view(np.uint8).max(initial=0) > 1:
        raise InvalidInputError(f"{field}: BOOL binary data must hold bytes 0 or 1 only")
    return array.reshape(shape)


def encode_response(
    model: str,
    version: int,
    outputs: Mapping[str, np.ndarray],
    request: InferRequest,
) -> tuple[bytes, int | None]:
    """The response body, and the length of its JSON part when binary outputs follow it."""
    if request.outputs is not None:
        unknown = [n for n in request.outputs if n not in outputs]
        if unknown:
            raise InvalidInputError(
                f"outputs {unknown} are not outputs of this model; expected {sorted(outputs)}"
            )
    names = list(outputs) if request.outputs is None else list(request.outputs)
    tensors, raw = [], []
    for name in names:
        array = np.ascontiguousarray(outputs[name])
        tensor = {
            "name": name,
            "datatype": fmt.datatype_of(array.dtype),
            "shape": list(array.shape),
        }
        if request.wants_binary(name):
            raw.append(array.tobytes() if sys.byteorder == "little" else array.byteswap().tobytes())
            tensor["parameters"] = {"binary_data_size": len(raw[-1])}
        else:
            # orjson writes NumPy arrays itself (no Python float per value); it has no
            # bfloat16, and NaN and infinities, which JSON cannot spell, become null.
            values = array.astype(np.float32) if tensor["datatype"] in ("BF16", "FP16") else array
            tensor["data"] = values.reshape(-1)
        tensors.append(tensor)
    doc: dict[str, Any] = {"model_name": model, "model_version": str(version), "outputs": tensors}
    if request.id is not None:
        doc["id"] = request.id
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    return (header, None) if not raw else (b"".join([header, *raw]), len(header))
