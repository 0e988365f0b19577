"""What the engine's step compiles to: its cost follows the tokens, not the cache's capacity.

Inspected on the compiled program (XLA's memory analysis), never timed: a step that copied a
cache-sized buffer (a layer sliced out of the [layers, slots, heads, dim] cache, or a cache
not donated and so rewritten out of place) takes time in proportion to num_blocks.
"""

from __future__ import annotations

import pytest
from flax import nnx

from jaxstack import nnlib
from jaxstack.serving import LLM

ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def model(tiny_lm_config):
    return nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0))


def compiled_decode_step(model, num_blocks: int):
    runner = LLM(model, **ENGINE, num_blocks=num_blocks).engine.runner
    return runner, runner.lower(ENGINE["max_num_seqs"]).compile().memory_analysis()


def test_the_step_updates_the_kv_cache_in_place_whatever_its_capacity(model):
    small_runner, small = compiled_decode_step(model, 64)
    big_runner, big = compiled_decode_step(model, 4096)
    layer_bytes = big_runner.k.nbytes // model.config.num_layers
    # The new K and V are the donated input buffers, written where they lie.
    assert big.alias_size_in_bytes == big_runner.k.nbytes + big_runner.v.nbytes
    assert small.alias_size_in_bytes == small_runner.k.nbytes + small_runner.v.nbytes
    # No scratch buffer grows with the cache: 64x the blocks, the same temporaries, all of
    # them smaller than one layer's keys.
    assert big.temp_size_in_bytes == small.temp_size_in_bytes
    assert big.temp_size_in_bytes < layer_bytes
