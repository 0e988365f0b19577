"""Model repository behaviour: hot reload under load, version policies, refusing bad artifacts."""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.client import HTTPConnection
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxstack.serving import ModelServer

X = np.random.default_rng(0).normal(size=(1, 12)).astype(np.float32)


def wait_for(condition, timeout=60.0, what="condition"):
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def expected_for(zoo, seed):
    return np.asarray(jax.jit(zoo.mlp)(zoo.init_mlp(seed), X))


def test_hot_reload_under_continuous_load_loses_no_request(zoo, tmp_path):
    zoo.export_mlp(tmp_path, 1)
    server = ModelServer(tmp_path, config=zoo.fast_config(), poll_interval_s=0.1).start()
    http = zoo.ServerThread(server)
    responses: list[tuple[int, dict]] = []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            status, doc, _ = http.request("POST", "/v2/models/mlp/infer",
                                          {"inputs": [zoo.tensor("x", X)]})  # fmt: skip
            responses.append((status, doc))

    def versions_seen():
        return {doc.get("model_version") for _, doc in list(responses)}

    clients = [threading.Thread(target=client) for _ in range(4)]
    try:
        for c in clients:
            c.start()
        wait_for(lambda: len(responses) >= 20, what="traffic on version 1")
        zoo.export_mlp(tmp_path, 2)  # appears atomically; latest-1 policy switches to it
        wait_for(lambda: "2" in versions_seen(), what="version 2 to take traffic")
        wait_for(lambda: server.versions("mlp") == [2], what="version 1 to be unloaded")
        assert http.request("GET", "/v2/models/mlp/versions/1/ready")[0] == 404
        shutil.rmtree(tmp_path / "mlp" / "2")  # removed: drained, version 1 is latest again
        wait_for(lambda: server.versions("mlp") == [1], what="fallback to version 1")
        switched = len(responses)
        wait_for(lambda: len(responses) >= switched + 20, what="traffic after the removal")
    finally:
        stop.set()
        for c in clients:
            c.join()
        http.close()
    statuses = [s for s, _ in responses]
    assert statuses.count(200) == len(statuses), {s for s in statuses if s != 200}
    expected = {"1": expected_for(zoo, 1), "2": expected_for(zoo, 2)}
    assert not np.allclose(expected["1"], expected["2"])
    for _, doc in responses:
        got = np.reshape(doc["outputs"][0]["data"], (1, 5))
        np.testing.assert_allclose(got, expected[doc["model_version"]], rtol=1e-6, atol=1e-6)
    order = [doc["model_version"] for _, doc in responses]
    assert order[0] == "1" and "2" in order
    # Each of the 4 clients may have had one request in flight across the switch back.
    assert set(order[switched + len(clients) :]) == {"1"}


def test_corrupted_version_is_refused_and_the_previous_one_served(zoo, tmp_path):
    zoo.export_mlp(tmp_path, 1)
    bad = zoo.export_mlp(tmp_path, 2)
    weights = bad / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    server = ModelServer(tmp_path, config=zoo.fast_config(), poll_interval_s=0).start()
    try:
        assert server.versions("mlp") == [1]
        assert "sha256" in server.failures()["mlp/2"]
        np.testing.assert_allclose(server.infer("mlp", {"x": X})["output_0"], expected_for(zoo, 1),
                                   rtol=1e-6, atol=1e-6)  # fmt: skip
        text = server.metrics.exposition().decode()
        assert 'jaxstack_serving_load_failures_total{model="mlp",version="2"} 1.0' in text
        # A failed version is not retried at every poll while its files are unchanged.
        assert server.poll() == {"loaded": [], "unloaded": []}
        # A partial copy (no manifest yet) is not a version at all.
        partial = tmp_path / "mlp" / "3"
        shutil.copytree(tmp_path / "mlp" / "1", partial)
        (partial / "manifest.json").unlink()
        assert server.poll() == {"loaded": [], "unloaded": []}
        shutil.copy(tmp_path / "mlp" / "1" / "manifest.json", partial / "manifest.json")
        # Complete now, but its metadata says version 1: refused with the reason.
        assert server.poll() == {"loaded": [], "unloaded": []}
        assert "holds 'mlp' version 1" in server.failures()["mlp/3"]
    finally:
        server.close()


def test_version_policies_from_the_repository_config(zoo, tmp_path):
    for v in (1, 2, 3):
        zoo.export_mlp(tmp_path, v)
    config = {"defaults": {"max_batch_size": 4},
              "models": {"mlp": {"version_policy": {"latest": 2}}}}  # fmt: skip
    (tmp_path / "serving.json").write_text(json.dumps(config))
    server = ModelServer(tmp_path, poll_interval_s=0).start()
    try:
        assert server.versions("mlp") == [2, 3]
        assert server.resolve("mlp").batcher.batch_sizes == (1, 2, 4)
        for v in (2, 3):
            np.testing.assert_allclose(server.infer("mlp", {"x": X}, version=v)["output_0"],
                                       expected_for(zoo, v), rtol=1e-6, atol=1e-6)  # fmt: skip
        config["models"]["mlp"]["version_policy"] = {"specific": [1]}
        (tmp_path / "serving.json").write_text(json.dumps(config))
        assert server.poll() == {"loaded": ["mlp/1"], "unloaded": ["mlp/2", "mlp/3"]}
        assert server.versions("mlp") == [1]
        # An invalid config is reported and the last good one kept.
        (tmp_path / "serving.json").write_text('{"models": {"mlp": {"max_batch": 3}}}')
        assert server.poll() == {"loaded": [], "unloaded": []}
    finally:
        server.close()


def test_an_invalid_config_is_logged_once_per_change_without_a_traceback(zoo, tmp_path, caplog):
    zoo.export_mlp(tmp_path, 1)
    config = tmp_path / "serving.json"
    config.write_text('{"defaults": {"max_batch_size": 2}}')
    server = ModelServer(tmp_path, poll_interval_s=0).start()
    try:
        caplog.set_level(logging.INFO, logger="jaxstack.serving.models")
        config.write_text('{"defaults": {"max_batch": 3}}')
        for _ in range(3):
            server.poll()
        config.write_text('{"defaults": {"max_queue_size": 0}}')
        for _ in range(3):
            server.poll()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [r.exc_info for r in errors] == [None, None]
        assert "unknown keys ['max_batch']" in errors[0].getMessage()
        assert "max_queue_size 0 must be >= 1" in errors[1].getMessage()
        assert all("serving.json" in r.getMessage() for r in errors)
        assert server.resolve("mlp").batcher.max_batch_size == 2  # the last good config
    finally:
        server.close()


def test_command_line_server_listens_at_once_and_drains_open_connections_on_sigterm(zoo, tmp_path):
    zoo.export_mlp(tmp_path, 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = Path(sys.executable).parent / "jaxstack-serve-models"
    process = subprocess.Popen(
        [str(command), "--repository", str(tmp_path), "--port", str(port),
         "--max-batch-size", "2", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    body = json.dumps({"inputs": [zoo.tensor("x", X)]})
    terminated = False
    try:
        line = process.stdout.readline()
        assert f"listening on http://127.0.0.1:{port}" in line, line
        client = type("C", (), {"port": port, "request": zoo.ServerThread.request})()
        wait_for(lambda: _ready(client), 30, "the command's server")
        # A keep-alive connection that has been answered once and is idle when SIGTERM comes.
        kept = HTTPConnection("127.0.0.1", port, timeout=30)
        kept.request("POST", "/v2/models/mlp/infer", body=body)
        first = kept.getresponse()
        assert first.status == 200 and first.read()
        process.send_signal(signal.SIGTERM)
        terminated = True
        time.sleep(0.5)  # the listener is closed by now
        kept.request("POST", "/v2/models/mlp/infer", body=body)
        response = kept.getresponse()
        doc = json.loads(response.read())
        assert response.status == 200 and response.getheader("connection") == "close"
        np.testing.assert_allclose(np.reshape(doc["outputs"][0]["data"], (1, 5)),
                                   expected_for(zoo, 1), rtol=1e-6, atol=1e-6)  # fmt: skip
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        if not terminated:
            process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def _ready(client):
    try:
        return client.request("GET", "/v2/health/ready")[0] == 200
    except OSError:
        return False
