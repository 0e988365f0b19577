"""Shared test models (plain JAX, no Flax) and a real HTTP server on a loopback port."""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import uvicorn
from safetensors.numpy import save_file

from jaxstack.serving import ModelConfig, ModelServer, RepositoryConfig, create_app, export


def init_mlp(seed: int, sizes: tuple[int, ...] = (12, 32, 5)) -> dict[str, Any]:
    # NumPy, not jax.random: eager jax ops compile one by one and cost seconds on a busy CPU.
    rng = np.random.default_rng(seed)
    return {
        "layers": [
            {
                "kernel": (rng.normal(size=(m, n)) / np.sqrt(m)).astype(np.float32),
                "bias": np.full((n,), 0.1 * seed, np.float32),
            }
            for m, n in itertools.pairwise(sizes)
        ]
    }


def mlp(params: dict[str, Any], x: jax.Array) -> jax.Array:
    *hidden, last = params["layers"]
    for layer in hidden:
        x = jax.nn.relu(x @ layer["kernel"] + layer["bias"])
    return jax.nn.log_softmax(x @ last["kernel"] + last["bias"])


def init_cnn(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.normal(size=shape) * scale).astype(np.float32)

    return {
        "conv1": {"kernel": normal(3, 3, 1, 8, scale=0.3), "bias": np.zeros(8, np.float32)},
        "conv2": {"kernel": normal(3, 3, 8, 16, scale=0.1), "bias": np.zeros(16, np.float32)},
        "head": {"kernel": normal(16 * 4 * 4, 10, scale=0.05), "bias": np.zeros(10, np.float32)},
    }


def cnn(params: dict[str, Any], image: jax.Array, scale: jax.Array) -> dict[str, jax.Array]:
    """Two conv + pool stages on [B, 16, 16, 1] images; `scale` [B, 1] shows a second input."""

    def conv(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
        y = jax.lax.conv_general_dilated(
            x, p["kernel"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jax.nn.relu(y + p["bias"])

    def pool(x: jax.Array) -> jax.Array:
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    x = pool(conv(pool(conv(image, params["conv1"])), params["conv2"]))
    logits = (x.reshape(x.shape[0], -1) @ params["head"]["kernel"] + params["head"]["bias"]) * scale
    return {"logits": logits, "probs": jax.nn.softmax(logits)}


MLP_EXAMPLE = {"x": np.zeros((1, 12), np.float32)}
CNN_EXAMPLE = {"image": np.zeros((1, 16, 16, 1), np.float32), "scale": np.ones((1, 1), np.float32)}


def export_mlp(repository: Path, version: int, seed: int | None = None) -> Path:
    return export(
        mlp, init_mlp(version if seed is None else seed), MLP_EXAMPLE,
        name="mlp", version=version, repository=repository,
    )  # fmt: skip


def export_cnn(repository: Path, version: int) -> Path:
    return export(cnn, init_cnn(version), CNN_EXAMPLE, name="cnn", version=version,
                  repository=repository)  # fmt: skip


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    export_mlp(root, 1)
    export_cnn(root, 1)
    return root


@pytest.fixture(scope="module", name="http")
def model_http(repository: Path):
    """The model server over `repository`, behind a real uvicorn server, for one test module."""
    server = ModelServer(repository, config=fast_config(), poll_interval_s=0).start()
    thread = ServerThread(server)
    yield thread
    thread.close()


class ServerThread:
    """A real uvicorn server for a started ModelServer, on 127.0.0.1 and a free port."""

    def __init__(self, server: ModelServer, **app_options: Any):
        self.model_server = server
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            create_app(server, **app_options), log_level="warning", access_log=False
        )
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]})
        self.thread.start()
        deadline = time.time() + 30
        while not self.uvicorn.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
            content_type = response.getheader("Content-Type", "")
            doc = json.loads(raw) if "json" in content_type else raw.decode()
            return response.status, doc, dict(response.getheaders())
        finally:
            conn.close()

    def close(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(30)
        self.model_server.close()


def fast_config(**overrides: Any) -> RepositoryConfig:
    """Small compiled batch sizes keep warm-up cheap in tests."""
    return RepositoryConfig(ModelConfig(**{"max_batch_size": 8, "max_queue_delay_ms": 2.0,
                                           **overrides}))  # fmt: skip


def tensor(name: str, array: np.ndarray, datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "data": array.reshape(-1).tolist()}  # fmt: skip


class Zoo:
    """The helpers above, handed to tests as the `zoo` fixture (importlib mode has no
    `import conftest`)."""

    init_mlp = staticmethod(init_mlp)
    mlp = staticmethod(mlp)
    init_cnn = staticmethod(init_cnn)
    cnn = staticmethod(cnn)
    export_mlp = staticmethod(export_mlp)
    export_cnn = staticmethod(export_cnn)
    ServerThread = ServerThread
    fast_config = staticmethod(fast_config)
    tensor = staticmethod(tensor)
    MLP_EXAMPLE = MLP_EXAMPLE
    CNN_EXAMPLE = CNN_EXAMPLE


@pytest.fixture(scope="session")
def zoo() -> type[Zoo]:
    return Zoo


@pytest.fixture(scope="session")
def tiny_lm_config():
    """The LLM tests' nnlib model: 2 layers, d=64, over the byte tokenizer's 259 ids, with a
    wide init so that greedy argmax never hinges on a near tie. Engines built on it with the
    same options share their compiled step programs across test modules."""
    from jaxstack import nnlib

    return nnlib.ModelConfig(
        vocab_size=259, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        mlp_dim=128, max_seq_len=160, init_std=0.1,
    )  # fmt: skip


def _write_peft_adapter(folder, config, seed: int, modules=("q_proj", "v_proj"), rank=4) -> str:
    """A PEFT folder (peft's save_pretrained layout) adapting every layer's `modules`."""
    rng = np.random.default_rng(seed)
    out = {"q_proj": config.num_heads, "v_proj": config.num_kv_heads, "o_proj": None}
    tensors = {}
    for i in range(config.num_layers):
        for m in modules:
            d_in = config.d_model if m != "o_proj" else config.num_heads * config.head_dim
            d_out = (out[m] or 0) * config.head_dim or config.d_model
            name = f"base_model.model.model.layers.{i}.self_attn.{m}"
            tensors[f"{name}.lora_A.weight"] = rng.normal(0, 0.5, (rank, d_in)).astype(np.float32)
            tensors[f"{name}.lora_B.weight"] = rng.normal(0, 0.5, (d_out, rank)).astype(np.float32)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    settings = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": modules}
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    return str(folder)


@pytest.fixture(scope="session")
def write_peft_adapter():
    """`write(folder, config, seed, modules=("q_proj", "v_proj"), rank=4)`: a PEFT LoRA
    folder for an nnlib model of `config`, as peft's save_pretrained lays it out."""
    return _write_peft_adapter
