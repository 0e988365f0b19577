"""The model server's tensor data: the KServe v2 / Triton binary tensor data extension (bodies
built by hand as tritonclient writes them, and through tritonclient itself where it is
installed), and large JSON bodies read in bounded memory."""

import json
import time
import tracemalloc
from http.client import HTTPConnection

import jax
import numpy as np
import pytest

from jaxstack.serving._src.errors import InvalidInputError
from jaxstack.serving._src.models import kserve

HEADER = "Inference-Header-Content-Length"


def binary_body(doc: dict, *arrays: np.ndarray) -> tuple[bytes, int]:
    """The JSON header followed by the raw tensor bytes, as tritonclient's
    `_get_inference_request` joins them; the second value is the header's length."""
    header = json.dumps(doc).encode()
    return b"".join([header, *(a.tobytes() for a in arrays)]), len(header)


def binary_input(name: str, array: np.ndarray, datatype: str = "FP32") -> dict:
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "parameters": {"binary_data_size": array.nbytes}}  # fmt: skip


def post(http, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, dict]:
    conn = HTTPConnection("127.0.0.1", http.port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def split_response(body: bytes, headers: dict) -> dict[str, np.ndarray]:
    """Every output as an array, binary ones read as tritonclient's InferResult reads them."""
    length = int(headers.get(HEADER.lower(), len(body)))
    doc, offset, arrays = json.loads(body[:length]), length, {}
    dtypes = {"FP32": np.float32, "INT32": np.int32, "BOOL": np.bool_}
    for output in doc["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            arrays[output["name"]] = np.asarray(output["data"], dtypes[output["datatype"]])
        else:
            arrays[output["name"]] = np.frombuffer(body[offset : offset + size],
                                                   dtypes[output["datatype"]])  # fmt: skip
            offset += size
        arrays[output["name"]] = arrays[output["name"]].reshape(output["shape"])
    assert offset == len(body) or length == len(body)
    return arrays


def test_binary_inputs_and_outputs_equal_direct_jit(http, zoo):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 12)).astype(np.float32)
    doc = {"id": "b1", "inputs": [binary_input("x", x)],
           "outputs": [{"name": "output_0", "parameters": {"binary_data": True}}]}  # fmt: skip
    body, length = binary_body(doc, x)
    status, raw, headers = post(http, "/v2/models/mlp/infer", body, {
        "Content-Type": "application/octet-stream", HEADER: str(length)})  # fmt: skip
    assert status == 200, raw
    assert headers["content-type"] == "application/octet-stream"
    header = json.loads(raw[: int(headers[HEADER.lower()])])
    assert header["outputs"] == [{"name": "output_0", "datatype": "FP32", "shape": [3, 5],
                                  "parameters": {"binary_data_size": 60}}]  # fmt: skip
    assert len(raw) == int(headers[HEADER.lower()]) + 60
    expected = np.asarray(jax.jit(zoo.mlp)(zoo.init_mlp(1), x))
    # The server runs the batch padded to its bucket: the last bit may differ on some CPUs
    # (AVX2-only), any byte out of place would not.
    got = split_response(raw, headers)["output_0"]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_binary_and_json_tensors_mix_in_one_request(http, zoo):
    rng = np.random.default_rng(8)
    image = rng.normal(size=(2, 16, 16, 1)).astype(np.float32)
    scale = np.array([[1.0], [0.5]], np.float32)
    # As tritonclient sends it when no outputs are named: every output binary.
    doc = {"inputs": [binary_input("image", image), zoo.tensor("scale", scale)],
           "parameters": {"binary_data_output": True}}  # fmt: skip
    body, length = binary_body(doc, image)
    status, raw, headers = post(http, "/v2/models/cnn/infer", body, {HEADER: str(length)})
    assert status == 200, raw
    got = split_response(raw, headers)
    expected = jax.jit(zoo.cnn)(zoo.init_cnn(1), image, scale)
    assert sorted(got) == ["logits", "probs"]
    for name in got:
        np.testing.assert_allclose(got[name], np.asarray(expected[name]), rtol=1e-5, atol=1e-6)

    # binary_data on an output overrides binary_data_output; JSON outputs keep their data.
    doc["outputs"] = [{"name": "probs", "parameters": {"binary_data": False}}, {"name": "logits"}]
    body, length = binary_body(doc, image)
    status, raw, headers = post(http, "/v2/models/cnn/infer", body, {HEADER: str(length)})
    assert status == 200, raw
    header = json.loads(raw[: int(headers[HEADER.lower()])])
    assert "data" in header["outputs"][0] and "data" not in header["outputs"][1]
    got = split_response(raw, headers)
    np.testing.assert_allclose(got["probs"], np.asarray(expected["probs"]), rtol=1e-5, atol=1e-6)


def test_a_request_asking_no_binary_output_gets_plain_json(http, zoo):
    x = np.ones((1, 12), np.float32)
    body, length = binary_body({"inputs": [binary_input("x", x)]}, x)
    status, raw, headers = post(http, "/v2/models/mlp/infer", body, {HEADER: str(length)})
    assert status == 200 and headers["content-type"] == "application/json"
    assert HEADER.lower() not in headers
    assert len(json.loads(raw)["outputs"][0]["data"]) == 5


X = np.zeros((1, 12), np.float32)
BAD_BINARY = [
    ({"inputs": [binary_input("x", X)]}, X.tobytes()[:40], True,
     "binary_data_size 48 goes past the end of the body: 40 bytes follow the JSON header"),
    ({"inputs": [binary_input("x", X)]}, X.tobytes() + b"\0", True,
     "49 bytes follow the JSON header but the inputs' parameters.binary_data_size add up to 48"),
    ({"inputs": [{**binary_input("x", X), "parameters": {"binary_data_size": 40}}]},
     X.tobytes()[:40], True, "binary_data_size is 40 but shape [1, 12] of FP32 needs 48 bytes"),
    ({"inputs": [binary_input("x", X)]}, b"", False,
     "binary_data_size is given but the request has no Inference-Header-Content-Length header"),
    ({"inputs": [binary_input("x", X)]}, X.tobytes(), False,
     "if tensor bytes follow the JSON, send its length in the Inference-Header-Content-Length"),
    ({"inputs": [{**binary_input("x", X), "data": [0.0] * 12}]}, X.tobytes(), True,
     "inputs[0] has both data and binary_data_size; send one of them"),
    ({"inputs": [{**binary_input("x", X), "parameters": {"binary_data_size": "48"}}]},
     X.tobytes(), True, "binary_data_size must be a non-negative integer, got '48'"),
    ({"inputs": [binary_input("x", X)], "parameters": {"binary_data_output": 1}}, X.tobytes(),
     True, "parameters.binary_data_output must be true or false, got 1"),
    ({"inputs": [binary_input("x", X)], "outputs": [{"name": "output_0",
      "parameters": {"classification": 3}}]}, X.tobytes(), True,
     "outputs[0].parameters.classification is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "data", "with_header", "message"), BAD_BINARY)
def test_bad_binary_requests_are_400_naming_the_problem(http, doc, data, with_header, message):
    header = json.dumps(doc).encode()
    headers = {HEADER: str(len(header))} if with_header else {}
    status, raw, _ = post(http, "/v2/models/mlp/infer", header + data, headers)
    assert status == 400
    assert message in json.loads(raw)["error"]


@pytest.mark.parametrize(("value", "message"), [
    ("12x", "Inference-Header-Content-Length must be the JSON part's length in bytes, got '12x'"),
    ("100000", "Inference-Header-Content-Length 100000 must be between 1 and the body's length"),
    ("0", "Inference-Header-Content-Length 0 must be between 1"),
])  # fmt: skip
def test_a_bad_header_length_is_400(http, value, message):
    body, _ = binary_body({"inputs": [binary_input("x", X)]}, X)
    status, raw, _ = post(http, "/v2/models/mlp/infer", body, {HEADER: value})
    assert status == 400 and message in json.loads(raw)["error"]


def test_binary_bool_and_integer_inputs_decode_little_endian():
    flags = np.array([True, False, True])
    ids = np.array([[1, -2], [300, 4]], np.int32)
    doc = {"inputs": [binary_input("f", flags, "BOOL"), binary_input("i", ids, "INT32")]}
    body, length = binary_body(doc, flags, ids)
    request = kserve.decode_request(body, length)
    np.testing.assert_array_equal(request.inputs["f"], flags)
    np.testing.assert_array_equal(request.inputs["i"], ids)
    assert request.inputs["i"].dtype == np.int32
    body, length = binary_body({"inputs": [binary_input("f", flags, "BOOL")]}, np.uint8([1, 2, 0]))
    with pytest.raises(InvalidInputError, match="BOOL binary data must hold bytes 0 or 1"):
        kserve.decode_request(body, length)
    body, length = binary_body({"inputs": [binary_input("f", flags, "BOOL")],
                                "parameters": {"binary_data_output": "yes"}}, flags)  # fmt: skip
    with pytest.raises(InvalidInputError, match=r"^parameters\.binary_data_output must be true"):
        kserve.decode_request(body, length)


def number_list_body(rows: int) -> bytes:
    """A JSON body of `rows` x 12 short numbers, built without a list of Python objects."""
    data = (b"0.25," * (rows * 12))[:-1]
    return b'{"inputs":[{"name":"x","shape":[%d,12],"datatype":"FP32","data":[%b]}]}' % (
        rows,
        data,
    )


@pytest.mark.parametrize("nested", [False, True])
def test_json_data_is_read_in_bounded_memory(nested):
    body = number_list_body(100_000)  # 6 MB; the peak counts Python objects and arrays alike
    if nested:
        body = body.replace(b'"data":[', b'"data":[[').replace(b"]}]}", b"]]}]}")
    tracemalloc.start()
    try:
        request = kserve.decode_request(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert request.inputs["x"].shape == (100_000, 12)
    assert np.all(request.inputs["x"] == 0.25)
    # The decoded tensor is 0.8x the body, the slice being parsed ~2.5 MB more; parsing the
    # whole body with orjson took ~7x the body here (32 bytes per 5-byte number).
    assert peak < 1.5 * len(body), (peak, len(body))


def test_a_60_mb_json_body_answers_quickly(http):
    body = number_list_body(1_000_000)  # 60 MB of numbers, under the 64 MiB limit
    assert 60e6 < len(body) < 64 << 20
    start = time.perf_counter()
    status, raw, _ = post(http, "/v2/models/mlp/infer", body, {"Content-Type": "application/json"})
    elapsed = time.perf_counter() - start
    # The rows are far more than the model's max batch: the answer is a 400 saying so, and it
    # comes in seconds (it used to take over 120 s and a gigabyte).
    assert status == 400 and "1000000 rows" in json.loads(raw)["error"]
    assert elapsed < 60


def test_tritonclient_http_round_trip(http, zoo):
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http.port}")
    rng = np.random.default_rng(9)
    x = rng.normal(size=(4, 12)).astype(np.float32)
    expected = np.asarray(jax.jit(zoo.mlp)(zoo.init_mlp(1), x))
    for binary in (True, False):
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput("output_0", binary_data=binary)]
        result = client.infer("mlp", [tensor], outputs=outputs, request_id="t1")
        np.testing.assert_allclose(result.as_numpy("output_0"), expected, rtol=1e-6, atol=1e-6)
        assert result.get_response()["id"] == "t1"
    # No outputs named: tritonclient asks for every output in binary (binary_data_output).
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("mlp", [tensor], model_version="1")
    np.testing.assert_allclose(result.as_numpy("output_0"), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(Exception, match=r"inputs\[0\]\.name 'y'"):
        tensor = httpclient.InferInput("y", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        client.infer("mlp", [tensor])
    client.close()
