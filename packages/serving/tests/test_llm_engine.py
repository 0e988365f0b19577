"""The LLM engine against nnlib's own decoding: same greedy tokens, same log-probabilities.

The model is conftest's `tiny_lm_config`. All engines share one compiled program per shape,
so only the first test of a shape pays compile time.
"""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest
from flax import nnx

from jaxstack import datalib, nnlib
from jaxstack.serving import LLM, ConfigError, InvalidInputError, SamplingParams, StructuredOutput
from jaxstack.serving._src.llm.model_runner import num_compilations

TOKENIZER = datalib.ByteTokenizer()
ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=64)
# Two lengths (one reference compile each); the long one exceeds a step's token budget.
PROMPTS = [
    "hello world, my dear!",
    "the quick brown fox j",
    "aaaaaaaaaaaaaaaaaaaaa",
    "Once upon a time, the",
    "x" * 100,
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def make_model(config, seed: int = 0) -> nnlib.Transformer:
    return nnlib.Transformer(config, rngs=nnx.Rngs(seed))


def reference_greedy(model, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """nnlib.generate, one batch per prompt length."""
    out = {}
    for n in {len(p) for p in prompts}:
        group = [p for p in prompts if len(p) == n]
        ids = np.array([TOKENIZER.encode(p) for p in group])
        new = nnlib.generate(model, ids, max_tokens)[:, n:]
        out.update(zip(group, new.tolist(), strict=True))
    return [out[p] for p in prompts]


def reference_logprobs(model, ids: list[int]) -> np.ndarray:
    """log_softmax of the model's logits over the whole sequence at once, [len, vocab]."""
    apply, params = nnlib.as_function(model)
    logits, _ = jax.jit(apply)(params, np.array([ids]), np.arange(len(ids))[None])
    return np.asarray(jax.nn.log_softmax(logits[0], axis=-1))


@pytest.fixture(scope="module")
def dense(tiny_lm_config):
    model = make_model(tiny_lm_config)
    return model, LLM(model, TOKENIZER, **ENGINE)


@pytest.mark.parametrize("family", ["dense", "moe"])
def test_greedy_equals_nnlib_generate(family, dense, tiny_lm_config):
    if family == "dense":
        model, llm = dense
    else:
        moe = tiny_lm_config.replace(family="mixtral", num_experts=4, experts_per_token=2)
        model = make_model(moe)
        llm = LLM(model, TOKENIZER, **ENGINE)
    outputs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == reference_greedy(model, PROMPTS, 12)
    assert {o.outputs[0].finish_reason for o in outputs} == {"length"}
    assert llm.engine.stats()["kv_blocks_used"] == 0


def test_preemption_under_a_small_cache_keeps_greedy_outputs(dense):
    model, big = dense
    # 10 usable blocks of 16 slots; the five sequences need 27 together and must take turns.
    small = LLM(model, TOKENIZER, **ENGINE, num_blocks=11, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in big.generate(PROMPTS, params)]
    got = [o.outputs[0].token_ids for o in small.generate(PROMPTS, params)]
    assert small.engine.stats()["num_preemptions"] > 0
    assert got == expected
    assert small.engine.stats()["kv_blocks_used"] == 0


def test_a_long_context_model_gets_a_cache_within_its_memory_budget(tiny_lm_config):
    # HF configs say 32k-128k positions; one full-length cache per running sequence would
    # take gigabytes before the first request. The budget bounds the cache, and attention
    # reads only the pages a sequence holds, whatever the block table's width.
    model = make_model(tiny_lm_config.replace(max_seq_len=131072))
    budget = 96 * 2**20
    llm = LLM(model, TOKENIZER, **ENGINE, kv_cache_memory_bytes=budget)
    runner = llm.engine.runner
    assert runner.k.nbytes + runner.v.nbytes <= budget
    assert llm.engine.config.num_blocks - 1 >= 131072 // 16  # one full-length sequence fits
    outputs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == reference_greedy(model, PROMPTS, 12)


def test_a_memory_budget_below_one_sequence_is_refused_by_name(tiny_lm_config):
    model = make_model(tiny_lm_config.replace(max_seq_len=131072))
    with pytest.raises(ConfigError, match=r"kv_cache_memory_bytes=1048576 .* max_model_len"):
        LLM(model, TOKENIZER, **ENGINE, kv_cache_memory_bytes=2**20)


def test_steady_state_steps_never_recompile(dense):
    _, llm = dense
    llm.engine.runner.warmup()
    before = num_compilations()
    rng = np.random.default_rng(0)
    prompts = [
        "".join(chr(97 + c) for c in rng.integers(0, 26, n)) for n in rng.integers(1, 90, 24)
    ]
    settings = zip(
        rng.choice([0.0, 0.7, 1.0], 24),
        rng.integers(0, 50, 24),
        rng.integers(1, 30, 24),
        strict=True,
    )
    params = [
        SamplingParams(
            temperature=float(t),
            top_p=0.9,
            top_k=int(k),
            max_tokens=int(m),
            seed=i,
            ignore_eos=True,
        )
        for i, (t, k, m) in enumerate(settings)
    ]
    outputs = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in params]
    assert num_compilations() == before


def test_prefix_cache_reuses_a_shared_system_prompt(dense):
    model, llm = dense
    system = "You are a helpful assistant. Answer briefly and truthfully. " * 2  # 124 bytes
    hits_before = llm.engine.stats()["prefix_cache_hits"]
    first = llm.generate([system + "Hi"], GREEDY)[0]
    second = llm.generate([system + "Bye"], GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 112  # 7 full blocks of 16 of the shared 124 bytes
    assert llm.engine.stats()["prefix_cache_hits"] - hits_before == 112
    assert second.outputs[0].token_ids == reference_greedy(model, [system + "Bye"], 12)[0]


def test_logprobs_are_the_models_log_softmax(dense):
    model, llm = dense
    out = llm.generate(
        ["hello"],
        SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True, logprobs=4),
    )[0]
    sample = out.outputs[0]
    ids = out.prompt_token_ids + sample.token_ids
    ref = reference_logprobs(model, ids)[len(out.prompt_token_ids) - 1 : -1]
    np.testing.assert_allclose(sample.logprobs, ref[np.arange(8), sample.token_ids], atol=2e-4)
    for row, top in zip(ref, sample.top_logprobs, strict=True):
        best = np.argsort(-row)[:4]
        assert list(top) == best.tolist()
        np.testing.assert_allclose(list(top.values()), row[best], atol=2e-4)


def test_prompt_logprobs_with_zero_max_tokens(dense):
    model, llm = dense
    prompt = "x" * 90 + "the end"  # spans two steps: scores come from both chunks
    out = llm.generate([prompt], SamplingParams(max_tokens=0, prompt_logprobs=2))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    ids = out.prompt_token_ids
    ref = reference_logprobs(model, ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for j in range(1, len(ids)):
        entry = out.prompt_logprobs[j]
        np.testing.assert_allclose(entry[ids[j]], ref[j - 1, ids[j]], atol=2e-4)
        assert set(np.argsort(-ref[j - 1])[:2].tolist()) <= set(entry)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(dense):
    _, llm = dense
    params = SamplingParams(
        temperature=1.0, top_k=40, top_p=0.95, seed=7, max_tokens=16, ignore_eos=True
    )
    alone = llm.generate(["tell me"], params)[0].outputs[0].token_ids
    crowd = llm.generate(["tell me", "other", "prompts here"], params)[0].outputs[0].token_ids
    other = llm.generate(["tell me"], params.replace(seed=8))[0].outputs[0].token_ids
    assert alone == crowd
    assert alone != other


def test_a_sampled_request_draws_the_same_with_or_without_a_top_p_neighbour(dense):
    # Alone, its steps skip the vocabulary sort; next to a top-p request they run it.
    _, llm = dense
    plain = SamplingParams(temperature=1.0, seed=11, max_tokens=16, ignore_eos=True)
    nucleus = plain.replace(top_p=0.5, seed=12)
    alone = llm.generate(["tell me"], plain)[0].outputs[0].token_ids
    mixed = llm.generate(["tell me", "other"], [plain, nucleus])[0].outputs[0].token_ids
    assert alone == mixed


def test_filters_that_leave_one_token_are_greedy(dense):
    _, llm = dense
    greedy = llm.generate(PROMPTS[:2], GREEDY)
    for params in (
        GREEDY.replace(temperature=1.0, top_k=1, seed=1),
        GREEDY.replace(temperature=1.0, top_p=1e-6, seed=2),
        GREEDY.replace(temperature=1.0, min_p=1.0, seed=3),
    ):
        got = llm.generate(PROMPTS[:2], params)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in greedy]


def test_n_samples_differ_and_repeat_with_the_seed(dense):
    _, llm = dense
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=10, ignore_eos=True)
    first = llm.generate(["abc"], params)[0]
    again = llm.generate(["abc"], params)[0]
    samples = [tuple(o.token_ids) for o in first.outputs]
    assert [o.index for o in first.outputs] == [0, 1, 2]
    assert len(set(samples)) == 3
    assert samples == [tuple(o.token_ids) for o in again.outputs]


def test_n_samples_compute_their_prompt_once(dense):
    # The other samples fork from the first one's prompt KV: one prefill instead of n. The
    # prompt's partly filled last block is copied, and every sample decodes on from it (on a
    # 21-token prompt, past the copied block; on a 100-token one, after a chunked prefill).
    model, _ = dense
    llm = LLM(model, TOKENIZER, **ENGINE)  # nothing in its prefix cache
    runner = llm.engine.runner
    params = SamplingParams(n=4, temperature=0.0, max_tokens=24, ignore_eos=True)
    runner.steps_by_shape.clear()
    [alone] = llm.generate([PROMPTS[0]], params)
    # 21 prompt tokens in a 32-token step, its four samples' rows; then four decode rows
    assert runner.steps_by_shape == {(32, 4): 1, (4, 4): 23}
    both = llm.generate([PROMPTS[0], PROMPTS[4]], params)
    expected = reference_greedy(model, [PROMPTS[0], PROMPTS[4]], 24)
    got = [[o.token_ids for o in request.outputs] for request in [alone, *both]]
    assert got == [[expected[0]] * 4, [expected[0]] * 4, [expected[1]] * 4]
    assert not any(llm.engine.blocks.ref_counts)  # shared blocks freed by every owner


def test_stop_token_ids_strings_and_max_tokens(dense):
    _, llm = dense
    base = llm.generate(["the quick brown fox"], GREEDY.replace(max_tokens=30))[0].outputs[0]
    stop_id = base.token_ids[5]
    first = base.token_ids.index(stop_id)
    by_id = llm.generate(
        ["the quick brown fox"], GREEDY.replace(max_tokens=30, stop_token_ids=[stop_id])
    )
    out = by_id[0].outputs[0]
    assert out.token_ids == base.token_ids[: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    # A stop string cut from the middle of the greedy text: the text ends right before it.
    text = base.text
    start = next(i for i in range(4, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    out = llm.generate(["the quick brown fox"], GREEDY.replace(max_tokens=30, stop=[stop]))[0]
    assert out.outputs[0].text == text[: text.index(stop)]
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", stop)


def test_without_detokenizing_the_tokens_are_the_same_and_the_text_empty(dense):
    _, llm = dense
    prompts = ["the quick brown fox", "once upon"]
    params = SamplingParams(n=2, temperature=0.9, seed=3, max_tokens=12)
    with_text = llm.generate(prompts, params)
    without = llm.generate(prompts, params.replace(detokenize=False))
    for a, b in zip(with_text, without, strict=True):
        assert [o.token_ids for o in b.outputs] == [o.token_ids for o in a.outputs]
        assert [o.finish_reason for o in b.outputs] == [o.finish_reason for o in a.outputs]
        assert [o.text for o in b.outputs] == ["", ""]
        assert all(o.text == TOKENIZER.decode(o.token_ids) for o in a.outputs)
    with pytest.raises(Exception, match="detokenize=False cannot match stop strings"):
        SamplingParams(stop=["."], detokenize=False)


def test_presence_penalty_breaks_a_repetition(dense):
    _, llm = dense
    plain = llm.generate(["a"], GREEDY)[0].outputs[0].token_ids
    penalised = llm.generate(["a"], GREEDY.replace(presence_penalty=2.0))[0].outputs[0].token_ids
    assert len(set(plain)) == 1  # this model repeats one token after "a"
    assert len(set(penalised)) > 6


def test_update_weights_serves_the_new_model_without_recompiling(tiny_lm_config):
    llm = LLM(make_model(tiny_lm_config), TOKENIZER, **ENGINE)
    llm.generate(PROMPTS[:2], GREEDY)
    before = num_compilations()
    other = make_model(tiny_lm_config, seed=1)
    llm.update_weights(nnx.state(other, nnx.Param))
    got = llm.generate(PROMPTS[:2], GREEDY)
    assert [o.outputs[0].token_ids for o in got] == reference_greedy(other, PROMPTS[:2], 12)
    assert num_compilations() == before


def test_update_weights_refuses_another_model_and_keeps_serving_its_own(tiny_lm_config):
    model = make_model(tiny_lm_config)
    llm = LLM(model, TOKENIZER, **ENGINE)
    wider = make_model(tiny_lm_config.replace(mlp_dim=256), seed=1)
    with pytest.raises(InvalidInputError, match="structure, shapes and dtypes"):
        llm.update_weights(nnx.state(wider, nnx.Param))
    got = llm.generate(PROMPTS[:2], GREEDY)
    assert [o.outputs[0].token_ids for o in got] == reference_greedy(model, PROMPTS[:2], 12)


def broken_params(**fields) -> SamplingParams:
    """Params the sampler cannot take (a min_p that is no number), as a stand-in for any
    request that makes a step raise: validation is bypassed on purpose."""
    params = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, **fields)
    object.__setattr__(params, "min_p", "high")
    return params


def test_a_request_that_makes_the_sampler_raise_fails_alone(dense):
    model, llm = dense
    engine = llm.engine
    prompts = PROMPTS[:3]
    expected = reference_greedy(model, prompts, 12)
    good = [engine.add_request(TOKENIZER.encode(p), GREEDY) for p in prompts[:2]]
    bad = engine.add_request(TOKENIZER.encode("break me"), broken_params(n=2))
    later = engine.add_request(TOKENIZER.encode(prompts[2]), GREEDY)
    while engine.has_unfinished():
        engine.step()
    assert [s[0].output.token_ids for s in (*good, later)] == expected
    assert [q.output.finish_reason for q in bad] == ["error", "error"]
    assert all(isinstance(q.error, ValueError) and "high" in str(q.error) for q in bad)
    assert engine.blocks.num_used_blocks == 0 and not engine.sequences
    # The engine goes on: the same prompts answer as before.
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == expected


def test_seeds_anywhere_in_64_bits_and_huge_top_k_sample(dense):
    _, llm = dense
    outs = {}
    for seed in (-1, -(2**63), 2**32, 2**63 - 1, 2**64 - 1, 7):
        params = SamplingParams(temperature=1.0, max_tokens=6, seed=seed, ignore_eos=True)
        outs[seed] = llm.generate(["abc"], params)[0].outputs[0].token_ids
        again = llm.generate(["abc"], params)[0].outputs[0].token_ids
        assert again == outs[seed]
    assert outs[-1] == outs[2**64 - 1]  # one 64-bit pattern, read signed or unsigned
    del outs[-1]
    assert len({tuple(t) for t in outs.values()}) == len(outs)
    big_k = SamplingParams(temperature=0.0, top_k=2**40, max_tokens=6, ignore_eos=True)
    assert (
        llm.generate(["abc"], big_k)[0].outputs[0].token_ids
        == llm.generate(["abc"], big_k.replace(top_k=0))[0].outputs[0].token_ids
    )
    with pytest.raises(Exception, match="seed=18446744073709551616 must be a 64-bit integer"):
        SamplingParams(seed=2**64)


def test_offline_generate_raises_the_failed_requests_error(dense):
    _, llm = dense
    with pytest.raises(ValueError, match="high"):
        llm.generate(["fine", "broken"], [GREEDY, broken_params()])
    assert llm.engine.blocks.num_used_blocks == 0


def test_logit_bias_forces_or_bans_a_token(dense):
    _, llm = dense
    plain = llm.generate(["abc"], GREEDY)[0].outputs[0].token_ids
    forced = GREEDY.replace(logit_bias={7: 100.0})
    assert llm.generate(["abc"], forced)[0].outputs[0].token_ids == [7] * GREEDY.max_tokens
    banned = GREEDY.replace(logit_bias={plain[0]: -100.0})
    assert llm.generate(["abc"], banned)[0].outputs[0].token_ids[0] != plain[0]
    # A row without a bias in the same batch samples as it does alone.
    together = llm.generate(["abc", "abc"], [forced, GREEDY])
    assert together[1].outputs[0].token_ids == plain
    with pytest.raises(Exception, match="logit_bias keys must be token ids < 259"):
        llm.generate(["abc"], GREEDY.replace(logit_bias={259: 1.0}))


def test_min_tokens_holds_back_stop_tokens_and_strings_until_reached(dense):
    _, llm = dense
    plain = llm.generate(["abc"], GREEDY)[0].outputs[0]
    first = plain.token_ids[0]
    stop_early = GREEDY.replace(stop_token_ids=[first])
    assert llm.generate(["abc"], stop_early)[0].outputs[0].token_ids == [first]
    held = llm.generate(["abc"], stop_early.replace(min_tokens=4))[0].outputs[0]
    assert first not in held.token_ids[:4] and len(held.token_ids) >= 4
    assert held.finish_reason == "length" or held.token_ids[-1] == first
    # A stop string that the first tokens spell is not matched before min_tokens.
    stop_text = GREEDY.replace(stop=[plain.text[:1]], min_tokens=3)
    text = llm.generate(["abc"], stop_text)[0].outputs[0]
    assert len(text.token_ids) >= 3
    with pytest.raises(Exception, match="min_tokens=13 must be >= 0 and at most max_tokens"):
        GREEDY.replace(min_tokens=13)


SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "wanted, valid",
    [
        (StructuredOutput("json_schema", SCHEMA), lambda t: set(json.loads(t)) == {"n", "ok"}),
        (StructuredOutput("regex", r"[a-c]{3}-\d\d"), lambda t: re.fullmatch(r"[a-c]{3}-\d\d", t)),
        (StructuredOutput("choice", ["red", "green"]), lambda t: t in ("red", "green")),
    ],
)
def test_structured_output_is_what_was_asked_whatever_the_model_says(dense, wanted, valid):
    """A random tiny model left to itself writes bytes; under a grammar, every sample of every
    seed is valid output, and it ends when the grammar is complete."""
    _, llm = dense
    params = SamplingParams(temperature=1.0, max_tokens=150, structured_output=wanted, n=3, seed=5)
    for out in llm.generate(["write: "], params)[0].outputs:
        assert out.finish_reason == "stop", out.text
        assert valid(out.text), out.text


def test_a_bad_grammar_is_refused_before_it_runs(dense):
    _, llm = dense
    with pytest.raises(Exception, match="'structured_output' is not valid"):
        llm.generate(["x"], SamplingParams(structured_output=StructuredOutput("regex", "(")))
