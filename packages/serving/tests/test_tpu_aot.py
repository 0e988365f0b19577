"""The LLM engine's step program compiled for a TPU v6e chip on this CPU machine.

The same ModelRunner that serves on CPU builds the step's arguments; they are made abstract and
placed on a v6e device described by libtpu, and inside `kernlib.target_device` kernlib's
dispatch chooses its Mosaic TPU ragged paged attention by itself (no implementation is named
anywhere in the engine). The TPU compiler then compiles the whole step: model, paged KV-cache
update, attention kernel, sampling. Needs libtpu next to jax (`nox -s tpu_aot`; there
JAXSTACK_REQUIRE_LIBTPU=1 turns the skip into a failure).
"""

from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstack import kernlib, nnlib
from jaxstack.serving import LLM
from jaxstack.serving._src.llm import model_runner

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None and not os.environ.get("JAXSTACK_REQUIRE_LIBTPU"),
    reason="libtpu is not installed (nox -s tpu_aot installs it)",
)

# a small Llama-shaped model in bfloat16, with TPU-sized heads (GQA 16 / 4 of 128)
CONFIG = dict(
    vocab_size=32000, d_model=1024, num_layers=2, num_heads=16, num_kv_heads=4, head_dim=128,
    mlp_dim=2816, max_seq_len=2048, dtype="bfloat16",
)  # fmt: skip
ENGINE = dict(max_num_seqs=32, max_num_batched_tokens=256, num_blocks=512, block_size=16)


def abstract_on(device, tree):
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype, sharding=sharding), tree
    )


@pytest.fixture(scope="module")
def runner():
    model = nnlib.Transformer(nnlib.ModelConfig(**CONFIG), rngs=nnx.Rngs(0))
    runner = LLM(model, **ENGINE).engine.runner
    runner.allocate_cache("page_major")  # the layout a runner on TPU allocates (Mosaic's)
    return runner


@pytest.mark.parametrize("num_tokens", [32, 256], ids=["decode", "mixed prefill+decode"])
def test_engine_step_compiles_for_v6e_with_mosaic_ragged_paged_attention(runner, num_tokens):
    chip = kernlib.tpu_devices("v6e")[0]
    x = runner._empty_inputs(runner.bucket(num_tokens))
    arrays, static = runner._step_args(x, scores=False)
    with kernlib.target_device(chip):
        lowered = model_runner._forward.lower(*abstract_on(chip, arrays), **static)
    compiled = lowered.compile()
    # one Mosaic ragged-paged-attention call per layer, chosen by kernlib's dispatch
    assert lowered.as_text().count("@tpu_custom_call") == CONFIG["num_layers"]
    memory = compiled.memory_analysis()
    cache_bytes = runner.k.nbytes + runner.v.nbytes
    assert memory.alias_size_in_bytes == cache_bytes  # the KV cache is updated in place on TPU
    assert memory.temp_size_in_bytes < cache_bytes
    # the cost model sees at least the layers' matmuls over every token row (not the kernel's)
    c = CONFIG
    attention = c["d_model"] * (2 * c["num_heads"] + 2 * c["num_kv_heads"]) * c["head_dim"]
    dense = c["num_layers"] * (attention + 3 * c["d_model"] * c["mlp_dim"])
    assert compiled.cost_analysis()["flops"] >= 2 * dense * num_tokens
