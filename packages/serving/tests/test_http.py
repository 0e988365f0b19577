"""KServe v2 REST over a real uvicorn server on a loopback port."""

import importlib.metadata
import json
import re
import threading
from http.client import HTTPConnection

import jax
import numpy as np
import pytest

from jaxstack.serving import ModelServer, export


def metric(text, name, **labels):
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{selector}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_health_and_metadata(http):
    assert http.request("GET", "/v2/health/live")[:2] == (200, {"live": True})
    assert http.request("GET", "/v2/health/ready")[:2] == (200, {"ready": True})
    status, doc, _ = http.request("GET", "/v2/models/cnn")
    assert status == 200
    assert doc["versions"] == ["1"]
    assert doc["inputs"] == [
        {"name": "image", "datatype": "FP32", "shape": [-1, 16, 16, 1]},
        {"name": "scale", "datatype": "FP32", "shape": [-1, 1]},
    ]
    assert [o["name"] for o in doc["outputs"]] == ["logits", "probs"]
    assert doc["parameters"]["batch_sizes"] == [1, 2, 4, 8]
    assert http.request("GET", "/v2/models/mlp/versions/1/ready")[0] == 200
    status, doc, _ = http.request("GET", "/v2/models/mlp/versions/7/ready")
    assert status == 404
    assert "version 7" in doc["error"] and "served versions: [1]" in doc["error"]
    status, doc, _ = http.request("GET", "/v2/models/nope")
    assert status == 404 and "'nope'" in doc["error"] and "cnn" in doc["error"]


def test_mlp_and_cnn_results_equal_direct_jit(http, zoo):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 12)).astype(np.float32)
    for path in ("/v2/models/mlp/infer", "/v2/models/mlp/versions/1/infer"):
        status, doc, _ = http.request("POST", path, {"id": "r1", "inputs": [zoo.tensor("x", x)]})
        assert status == 200, doc
        assert (doc["model_name"], doc["model_version"], doc["id"]) == ("mlp", "1", "r1")
        (out,) = doc["outputs"]
        assert (out["name"], out["shape"], out["datatype"]) == ("output_0", [3, 5], "FP32")
        expected = np.asarray(jax.jit(zoo.mlp)(zoo.init_mlp(1), x))
        np.testing.assert_allclose(np.reshape(out["data"], out["shape"]), expected, rtol=1e-6,
                                   atol=1e-6)  # fmt: skip

    image = rng.normal(size=(2, 16, 16, 1)).astype(np.float32)
    scale = np.array([[1.0], [0.5]], np.float32)
    body = {"inputs": [zoo.tensor("image", image), zoo.tensor("scale", scale)],
            "outputs": [{"name": "probs"}]}  # fmt: skip
    status, doc, _ = http.request("POST", "/v2/models/cnn/infer", body)
    assert status == 200, doc
    assert [o["name"] for o in doc["outputs"]] == ["probs"]
    expected = np.asarray(jax.jit(zoo.cnn)(zoo.init_cnn(1), image, scale)["probs"])
    np.testing.assert_allclose(np.reshape(doc["outputs"][0]["data"], (2, 10)), expected,
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_concurrent_requests_are_batched_and_counted_in_metrics(http, zoo):
    before = http.request("GET", "/metrics")[1]
    rng = np.random.default_rng(9)
    xs = rng.normal(size=(48, 1, 12)).astype(np.float32)
    expected = np.asarray(jax.jit(zoo.mlp)(zoo.init_mlp(1), xs[:, 0]))
    results = [None] * len(xs)

    def client(indices):
        for i in indices:
            status, doc, _ = http.request("POST", "/v2/models/mlp/infer",
                                          {"inputs": [zoo.tensor("x", xs[i])]})  # fmt: skip
            results[i] = (status, doc)

    threads = [threading.Thread(target=client, args=(range(k, 48, 12),)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (status, doc) in enumerate(results):
        assert status == 200, doc
        np.testing.assert_allclose(doc["outputs"][0]["data"], expected[i], rtol=1e-6, atol=1e-6)
    after = http.request("GET", "/metrics")[1]
    labels = {"model": "mlp", "version": "1"}
    ok = metric(after, "jaxstack_serving_requests_total", code="200", **labels)
    assert ok - metric(before, "jaxstack_serving_requests_total", code="200", **labels) == 48
    rows = metric(after, "jaxstack_serving_batch_size_sum", **labels) - metric(
        before, "jaxstack_serving_batch_size_sum", **labels
    )
    batches = metric(after, "jaxstack_serving_batch_size_count", **labels) - metric(
        before, "jaxstack_serving_batch_size_count", **labels
    )
    assert rows == 48 and 1 <= batches <= 48
    for name in ("request_latency_seconds", "queue_time_seconds", "batch_compute_seconds"):
        assert metric(after, f"jaxstack_serving_{name}_count", **labels) > 0


BAD_REQUESTS = [
    (b"{not json", 400, "not valid JSON"),
    ({"inputs": []}, 400, "inputs must be a non-empty list"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP32"}]}, 400, "inputs[0].data"),
    ({"inputs": [{"name": "y", "shape": [1, 12], "datatype": "FP32", "data": [0.0] * 12}]},
     400, "inputs[0].name 'y'"),
    ({"inputs": [{"name": "x", "shape": [1, 11], "datatype": "FP32", "data": [0.0] * 11}]},
     400, "inputs[0].shape [1, 11]"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "INT32", "data": [0] * 12}]},
     400, "datatype int32 but the model takes FP32"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP32", "data": [0.0] * 5}]},
     400, "inputs[0].data has 5 elements"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP99", "data": [0.0] * 12}]},
     400, "inputs[0].datatype 'FP99'"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP32", "data": ["a"] * 12}]},
     400, "inputs[0].data holds"),
    ({"inputs": [{"name": "x", "shape": [9, 12], "datatype": "FP32", "data": [0.0] * 108}]},
     400, "9 rows"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP32", "data": [0.0] * 12}],
      "outputs": [{"name": "nope"}]}, 400, "outputs ['nope']"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP32", "data": [True] * 12}]},
     400, "inputs[0].data holds booleans, which are not FP32 values"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP32",
                  "data": [[0.5, True] + [0.0] * 10]}]},
     400, "inputs[0].data mixes booleans and numbers"),
    ({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP32",
                  "data": [True, 1] + [False] * 10}]},
     400, "inputs[0].data mixes booleans and numbers"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS)
def test_bad_requests_get_4xx_naming_the_field(http, body, status, message):
    got, doc, _ = http.request("POST", "/v2/models/mlp/infer", body)
    assert got == status
    assert message in doc["error"]


def test_unknown_model_or_version_is_404_and_the_server_keeps_serving(http, zoo):
    x = np.zeros((1, 12), np.float32)
    body = {"inputs": [zoo.tensor("x", x)]}
    status, doc, _ = http.request("POST", "/v2/models/ghost/infer", body)
    assert status == 404 and "model 'ghost' is not served" in doc["error"]
    status, doc, _ = http.request("POST", "/v2/models/mlp/versions/3/infer", body)
    assert status == 404 and "version 3" in doc["error"]
    status, doc, _ = http.request("POST", "/v2/models/mlp/versions/latest/infer", body)
    assert status == 404 and "'latest'" in doc["error"]
    assert http.request("POST", "/v2/models/mlp/infer", body)[0] == 200
    text = http.request("GET", "/metrics")[1]
    assert metric(text, "jaxstack_serving_requests_total", model="_unknown", version="_none",
                  code="404") >= 1  # fmt: skip


def test_version_segments_are_ascii_digits_and_every_refusal_is_counted(http, zoo):
    body = {"inputs": [zoo.tensor("x", np.zeros((1, 12), np.float32))]}
    before = http.request("GET", "/metrics")[1]
    # Superscript two and Arabic-Indic one are Unicode digits, not version numbers.
    for segment in ("%C2%B2", "%D9%A1", "abc"):
        status, doc, _ = http.request("POST", f"/v2/models/mlp/versions/{segment}/infer", body)
        assert status == 404, (segment, doc)
        assert "must be a positive integer" in doc["error"]
        status, doc, _ = http.request("GET", f"/v2/models/mlp/versions/{segment}/ready")
        assert status == 404 and "must be a positive integer" in doc["error"]
    after = http.request("GET", "/metrics")[1]
    labels = {"model": "mlp", "version": "_none", "code": "404"}
    counted = metric(after, "jaxstack_serving_requests_total", **labels)
    assert counted - metric(before, "jaxstack_serving_requests_total", **labels) == 3


def test_unknown_routes_and_wrong_methods_answer_in_the_protocol_error_format(http):
    status, doc, _ = http.request("GET", "/v2/nowhere")
    assert status == 404 and doc == {"error": "no route GET /v2/nowhere"}
    status, doc, headers = http.request("GET", "/v2/models/mlp/infer")
    assert status == 405 and doc == {"error": "GET is not allowed on /v2/models/mlp/infer"}
    assert headers["allow"] == "POST"


def test_server_metadata_names_the_server_version(http):
    status, doc, _ = http.request("GET", "/v2")
    assert status == 200
    assert doc["name"] == "jaxstack-serving"
    assert doc["version"] == importlib.metadata.version("jaxstack-serving")
    assert "binary_tensor_data" in doc["extensions"]


def test_oversized_body_is_413_and_busy_is_503_with_retry_after(repository, zoo):
    server = ModelServer(repository, config=zoo.fast_config(), poll_interval_s=0).start()
    small = zoo.ServerThread(server, max_request_bytes=300)
    try:
        x = np.zeros((8, 12), np.float32)
        status, doc, _ = small.request("POST", "/v2/models/mlp/infer",
                                       {"inputs": [zoo.tensor("x", x)]})  # fmt: skip
        assert status == 413 and "exceeds the limit of 300" in doc["error"]
        assert small.request("POST", "/v2/models/mlp/infer",
                             {"inputs": [zoo.tensor("x", x[:1])]})[0] == 200  # fmt: skip
        # A draining version refuses with 503 + Retry-After when a client pins it.
        server.resolve("mlp", 1).batcher.close()
        status, doc, headers = small.request("POST", "/v2/models/mlp/versions/1/infer",
                                             {"inputs": [zoo.tensor("x", x[:1])]})  # fmt: skip
        assert status == 503 and "draining" in doc["error"]
        assert headers["retry-after"] == "1"
    finally:
        small.close()


def test_the_body_limit_holds_for_chunked_bodies_without_content_length(repository, zoo):
    server = ModelServer(repository, config=zoo.fast_config(), poll_interval_s=0).start()
    small = zoo.ServerThread(server, max_request_bytes=300)
    try:
        body = json.dumps({"inputs": [zoo.tensor("x", np.zeros((8, 12), np.float32))]}).encode()
        conn = HTTPConnection("127.0.0.1", small.port, timeout=30)
        chunks = (body[i : i + 100] for i in range(0, len(body), 100))
        conn.request("POST", "/v2/models/mlp/infer", body=chunks, encode_chunked=True,
                     headers={"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        doc = json.loads(response.read())
        assert response.status == 413 and "exceeds the limit of 300" in doc["error"]
    finally:
        small.close()


def test_the_port_answers_while_models_load_and_ready_says_503_until_then(repository, zoo):
    server = ModelServer(repository, config=zoo.fast_config(), poll_interval_s=0)
    http = zoo.ServerThread(server)  # listening before a single model is loaded
    try:
        assert http.request("GET", "/v2/health/live")[:2] == (200, {"live": True})
        assert http.request("GET", "/v2/health/ready")[:2] == (503, {"ready": False})
        body = {"inputs": [zoo.tensor("x", np.zeros((1, 12), np.float32))]}
        status, doc, headers = http.request("POST", "/v2/models/mlp/infer", body)
        assert status == 503 and "still loading" in doc["error"]
        assert headers["retry-after"] == "1"
        server.start()
        assert http.request("GET", "/v2/health/ready")[:2] == (200, {"ready": True})
        assert http.request("POST", "/v2/models/mlp/infer", body)[0] == 200
    finally:
        http.close()


def test_non_finite_outputs_are_sent_as_json_null(tmp_path, zoo):
    export(lambda p, x: x / p["zero"], {"zero": np.zeros((), np.float32)},
           {"x": np.zeros((1, 2), np.float32)}, name="div", version=1,
           repository=tmp_path)  # fmt: skip
    server = ModelServer(tmp_path, config=zoo.fast_config(), poll_interval_s=0).start()
    http = zoo.ServerThread(server)
    try:
        x = np.array([[1.0, 0.0]], np.float32)
        status, doc, _ = http.request("POST", "/v2/models/div/infer",
                                      {"inputs": [zoo.tensor("x", x)]})  # fmt: skip
        assert status == 200
        assert doc["outputs"][0]["data"] == [None, None]  # inf and nan
    finally:
        http.close()
