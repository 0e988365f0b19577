"""Check a request's arrays against a model signature, naming the offending field."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxstack.serving._src.errors import InvalidInputError
from jaxstack.serving._src.models.load import Signature


def validate_inputs(
    inputs: Mapping[str, np.ndarray], signature: Signature
) -> dict[str, np.ndarray]:
    """Check names, datatypes and shapes against the signature; errors name the field.

    `inputs` keeps the request's order, so `inputs[i]` in messages points at the request.
    """
    expected = {s.name: s for s in signature.inputs}
    for i, name in enumerate(inputs):
        if name not in expected:
            raise InvalidInputError(
                f"inputs[{i}].name {name!r} is not an input of this model; "
                f"expected {sorted(expected)}"
            )
    missing = [n for n in expected if n not in inputs]
    if missing:
        raise InvalidInputError(f"inputs is missing {missing}; the model needs {sorted(expected)}")
    arrays = {}
    rows = None
    for i, (name, array) in enumerate(inputs.items()):
        spec = expected[name]
        array = np.asarray(array)
        if array.dtype != spec.dtype:
            raise InvalidInputError(
                f"inputs[{i}] ({name!r}) has datatype {array.dtype.name} but the model takes "
                f"{spec.datatype}"
            )
        if array.ndim != len(spec.shape) or array.shape[1:] != spec.shape[1:]:
            raise InvalidInputError(
                f"inputs[{i}].shape {list(array.shape)} of {name!r} does not match the model's "
                f"{list(spec.shape)} (-1: any batch size)"
            )
        if rows is not None and array.shape[0] != rows:
            raise InvalidInputError(
                f"inputs[{i}].shape[0] = {array.shape[0]} of {name!r} differs from the batch "
                f"size {rows} of the other inputs"
            )
        rows = array.shape[0]
        arrays[name] = array
    return arrays
