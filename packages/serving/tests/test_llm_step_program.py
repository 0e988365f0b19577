"""What the engine's step compiles to: its cost follows the tokens, not the cache's capacity.

Inspected on the compiled program (XLA's memory analysis), never timed: a step that copied a
cache-sized buffer (a layer sliced out of the cache, whichever its layout, or a cache
not donated and so rewritten out of place) takes time in proportion to num_blocks.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from flax import nnx

from jaxstack import nnlib
from jaxstack.serving import LLM, SamplingParams
from jaxstack.serving._src.llm.model_runner import _copy_blocks

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


def test_a_forks_block_copy_writes_the_cache_in_place(model):
    # n > 1 samples copy their prompt's last block once: a copy program that rewrote the
    # cache out of place would cost in proportion to num_blocks.
    runner = LLM(model, **ENGINE, num_blocks=4096).engine.runner
    pairs = np.zeros(ENGINE["max_num_seqs"], np.int32)
    static = dict(block_size=runner.block_size, kv_layout=runner.kv_layout)
    compiled = _copy_blocks.lower(runner.k, runner.v, pairs, pairs, **static).compile()
    memory = compiled.memory_analysis()
    assert memory.alias_size_in_bytes == runner.k.nbytes + runner.v.nbytes
    assert memory.temp_size_in_bytes < runner.k.nbytes // model.config.num_layers // 8


# Block tables four loop chunks wide (the XLA attention walks them 16 pages at a time): the
# loop reads its pages from an operand, so a layer sliced out of the cache would be copied.
LONG = dict(ENGINE, max_model_len=1024)
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


@pytest.fixture(scope="module")
def long_model(tiny_lm_config):
    return nnlib.Transformer(tiny_lm_config.replace(max_seq_len=1024), rngs=nnx.Rngs(0))


def large_buffers(hlo: str, min_bytes: int) -> list[str]:
    """Instructions of the compiled entry computation that make an array of `min_bytes` or
    more, other than parameters, bitcasts, tuple elements and in-place updates (fusions whose
    root is a scatter or a dynamic-update-slice: with the cache donated they write into it)."""
    roots, entry, name = {}, [], None
    for line in hlo.splitlines():
        if m := re.match(r"(ENTRY )?%(\S+) .*\{$", line):
            name = "ENTRY" if m[1] else m[2]
        elif m := re.match(r"\s+ROOT %\S+ = \S+ ([\w-]+)\(", line):
            roots[name] = m[1]
        if name == "ENTRY":
            entry.append(line)
    found = []
    for line in entry:
        m = re.match(r"\s+(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\]\{[\d,]*\} ([\w-]+)\(", line)
        if not m or m[4] in ("parameter", "bitcast", "get-tuple-element"):
            continue
        called = re.search(r"calls=%([\w.-]+)", line)
        if m[4] == "fusion" and roots.get(called[1]) in ("scatter", "dynamic-update-slice"):
            continue
        size = DTYPE_BYTES.get(m[2], 8) * math.prod(int(d) for d in m[3].split(",") if d)
        if size >= min_bytes:
            found.append(f"{m[1]}: {m[2]}[{m[3]}] {m[4]}")
    return found


def test_the_step_makes_no_buffer_of_a_layers_size(long_model):
    runner = LLM(long_model, **LONG, num_blocks=4096).engine.runner
    compiled = runner.lower(ENGINE["max_num_seqs"]).compile()
    layer_bytes = runner.k.nbytes // long_model.config.num_layers
    assert large_buffers(compiled.as_text(), layer_bytes // 8) == []


def test_the_steps_scratch_memory_follows_neither_capacity_nor_context_length(long_model):
    def temp_bytes(**options):
        runner = LLM(long_model, **{**LONG, **options}).engine.runner
        compiled = runner.lower(ENGINE["max_num_seqs"]).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small = temp_bytes(num_blocks=129, max_model_len=256)
    big = temp_bytes(num_blocks=4096)
    layer_bytes = 4096 * 16 * long_model.config.num_kv_heads * long_model.config.head_dim * 4
    # 32x the cache and 4x the block tables' width: the scratch may grow by the wider tables
    # (8 sequences x 48 more int32 entries, a few copies of them), never by the cache.
    assert big - small < layer_bytes // 64


def test_only_batches_that_limit_top_k_or_top_p_sort_the_vocabulary(model):
    runner = LLM(model, **ENGINE).engine.runner

    def sorts(**variant) -> bool:
        return " sort(" in runner.lower_sampling(8, **variant).compile().as_text()

    assert not sorts(all_greedy=True)
    assert not sorts(all_greedy=False, top_k_top_p=False)
    assert sorts(all_greedy=False, top_k_top_p=True)


def test_only_batches_that_ask_for_alternatives_rank_the_vocabulary(model):
    runner = LLM(model, **ENGINE).engine.runner

    def ranks(**variant) -> bool:
        text = runner.lower_sampling(8, all_greedy=False, **variant).compile().as_text()
        return 'custom_call_target="TopK"' in text

    assert not ranks(top_k_top_p=False, top_logprobs=False)
    assert ranks(top_k_top_p=False, top_logprobs=True)


def test_a_one_token_budget_still_updates_the_cache_in_place(long_model):
    # One row makes XLA turn the scatter into a dynamic-update-slice that it does not do in
    # place (a copy of the whole cache per layer); steps are padded to at least 2 rows.
    options = dict(LONG, max_num_seqs=1, max_num_batched_tokens=1, num_blocks=1024)
    runner = LLM(long_model, **options).engine.runner
    compiled = runner.lower(1).compile()
    layer_bytes = runner.k.nbytes // long_model.config.num_layers
    assert large_buffers(compiled.as_text(), layer_bytes // 8) == []


def test_a_steps_sequence_rows_follow_its_sequences_not_its_tokens(model):
    # Attention groups and sampling rows are per sequence, token rows per token: a lone decode
    # padded to a 16-token step with 16 sequence rows did 8x the model's work and 16x the
    # attention's and sampling's that it needed.
    llm = LLM(model, **ENGINE)
    runner = llm.engine.runner
    assert runner.buckets == (2, 4, 8, 16, 32, 64)  # never 1 token: see the 1-token budget
    assert runner.row_buckets == (1, 2, 4, 8)
    # Rows from one per 16 tokens to one per token, at most max_num_seqs.
    assert runner.step_shapes() == [
        (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8),
        (16, 1), (16, 2), (16, 4), (16, 8), (32, 2), (32, 4), (32, 8), (64, 4), (64, 8),
    ]  # fmt: skip
    # The model per step shape; sampling per row bucket x (greedy, sampled, top-k/top-p) x
    # (with, without log-probability alternatives); the forks' block copy per row bucket.
    assert runner.num_programs == 18 + 4 * 3 * 2 + 4
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate([[1, 2, 3, 4, 5]], greedy)
    assert runner.steps_by_shape == {(8, 1): 1, (2, 1): 3}  # the prefill, three decodes
    runner.steps_by_shape.clear()
    llm.generate([[1, 2, 3], [4, 5, 6], [7, 8, 9]], greedy)
    assert runner.steps_by_shape == {(16, 4): 1, (4, 4): 3}
    runner.steps_by_shape.clear()
    llm.generate([list(range(1, 41))], greedy)
    assert runner.steps_by_shape == {(64, 4): 1, (2, 1): 3}


def test_the_one_sequence_step_updates_the_cache_in_place(long_model):
    runner = LLM(long_model, **LONG, num_blocks=4096).engine.runner
    compiled = runner.lower(1).compile()
    assert compiled.memory_analysis().alias_size_in_bytes == runner.k.nbytes + runner.v.nbytes
    layer_bytes = runner.k.nbytes // long_model.config.num_layers
    assert large_buffers(compiled.as_text(), layer_bytes // 8) == []


def test_fewer_sequence_rows_give_the_same_tokens_and_log_probabilities(model):
    # The same requests through the 2-row program and through the 8-row one (beside five
    # other sequences and a padding row), greedy and sampled: identical tokens, log-probs equal
    # to float32 rounding (the programs' attention matmuls batch 2 or 8 rows: a few ulps).
    llm = LLM(model, **ENGINE)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0.9, max_tokens=6, ignore_eos=True, seed=7, logprobs=3),
    ]
    few = llm.generate(prompts, params)
    assert set(llm.engine.runner.steps_by_shape) == {(16, 2), (2, 2)}  # prefills, decodes
    padded = llm.generate(prompts + [[1]] * 5, params + [params[0]] * 5)[:2]
    assert (8, 8) in llm.engine.runner.steps_by_shape
    for a, b in zip(few, padded, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        np.testing.assert_allclose(
            a.outputs[0].logprobs, b.outputs[0].logprobs, rtol=1e-6, atol=1e-6
        )
