"""Async scheduling: each step is launched before the previous one is recorded, and a decode
reads its input token on the device. Outputs must be those of waiting for every step."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from jaxstack import datalib, nnlib
from jaxstack.serving import LLM, SamplingParams

TOKENIZER = datalib.ByteTokenizer()
ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=64)
PROMPTS = ["hello world, my dear!", "the quick brown fox j", "x" * 100, "Once upon a time"]


@pytest.fixture(scope="module")
def model(tiny_lm_config):
    return nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0))


def mixed_requests(stop: str) -> list[SamplingParams]:
    """Greedy and seeded samples, n=2, a stop string, log-probabilities of both kinds, a
    penalty (its step must wait for the one before), different lengths."""
    sampled = SamplingParams(temperature=1.0, seed=5, max_tokens=20, ignore_eos=True)
    return [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3),
        sampled.replace(n=2, top_p=0.9),
        SamplingParams(temperature=0.0, max_tokens=40, stop=[stop], prompt_logprobs=2),
        sampled.replace(seed=9, presence_penalty=1.5, max_tokens=7),
    ]


def outputs(llm: LLM, params: list[SamplingParams]) -> list[tuple]:
    out = []
    for request in llm.generate(PROMPTS, params):
        prompt = [sorted(e.items()) if e else e for e in request.prompt_logprobs or []]
        for o in request.outputs:
            out.append((o.token_ids, o.text, o.finish_reason, o.logprobs, o.top_logprobs, prompt))
    return out


def assert_same(got: list[tuple], expected: list[tuple]) -> None:
    for (*a, a_top, a_prompt), (*b, b_top, b_prompt) in zip(got, expected, strict=True):
        assert a[:3] == b[:3]  # tokens, text, finish reason
        np.testing.assert_allclose(a[3], b[3], atol=1e-5)
        assert [list(d) for d in a_top or []] == [list(d) for d in b_top or []]
        for x, y in zip(a_top or [], b_top or [], strict=True):
            np.testing.assert_allclose(list(x.values()), list(y.values()), atol=1e-5)
        assert [[k for k, _ in e or []] for e in a_prompt] == [
            [k for k, _ in e or []] for e in b_prompt
        ]


@pytest.mark.parametrize("num_blocks", [None, 11], ids=["roomy cache", "preempting cache"])
def test_async_outputs_equal_waiting_for_every_step(model, num_blocks):
    engines = {
        on: LLM(model, TOKENIZER, **ENGINE, num_blocks=num_blocks, async_scheduling=on)
        for on in (False, True)
    }
    greedy = engines[False].generate(PROMPTS[2:3], SamplingParams(temperature=0.0, max_tokens=40))
    stop = greedy[0].outputs[0].text[9:11]  # ends request 2 mid-way, while its next step runs
    params = mixed_requests(stop)
    before = {on: llm.engine.stats()["generation_tokens"] for on, llm in engines.items()}
    expected = outputs(engines[False], params)
    got = outputs(engines[True], params)
    assert expected[3][2] == "stop"  # the stop string did end it early
    assert_same(got, expected)
    for on, llm in engines.items():
        stats = llm.engine.stats()
        assert stats["kv_blocks_used"] == 0 and llm.engine.in_flight is None
        # Tokens sampled for a sequence that had already stopped are not counted.
        generated = stats["generation_tokens"] - before[on]
        assert generated == sum(len(o[0]) for o in expected)
    if num_blocks:
        assert engines[True].engine.stats()["num_preemptions"] > 0


def launch_log(llm: LLM) -> list[int]:
    """Wraps the runner's launch: for each launch, how many of its sequences take their
    input token from the device."""
    log, launch = [], llm.engine.runner.launch

    def logged(batch, previous=None):
        log.append(sum(q.num_pending > 0 for q in batch.seqs))
        return launch(batch, previous)

    llm.engine.runner.launch = logged
    return log


@pytest.mark.parametrize("on", [False, True])
def test_decodes_read_their_tokens_on_the_device_only_under_async_scheduling(model, on):
    llm = LLM(model, TOKENIZER, **ENGINE, async_scheduling=on)
    log = launch_log(llm)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    # One prefill step, then seven decode steps of two sequences each.
    assert log == ([0] + [2] * 7 if on else [0] * 8)


def test_a_penalised_request_makes_the_next_step_wait_for_its_tokens(model):
    llm = LLM(model, TOKENIZER, **ENGINE)
    log = launch_log(llm)
    penalised = SamplingParams(temperature=1.0, seed=1, max_tokens=5, frequency_penalty=1.0)
    llm.generate(PROMPTS[:1], penalised)
    assert log == [0] * 5


def test_an_abort_while_its_step_runs_leaves_the_others_as_they_were(model):
    llm = LLM(model, TOKENIZER, **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = llm.generate(PROMPTS[:1], params)[0].outputs[0].token_ids
    engine = llm.engine
    [kept] = engine.add_request(TOKENIZER.encode(PROMPTS[0]), params)
    [aborted] = engine.add_request(TOKENIZER.encode(PROMPTS[1]), params)
    for _ in range(4):
        engine.step()
    assert engine.in_flight is not None and aborted.num_pending == 1
    recorded = list(aborted.output.token_ids)
    assert engine.abort(aborted.request_id) == 1
    while engine.has_unfinished():
        engine.step()
    assert kept.output.token_ids == expected
    assert aborted.output.token_ids == recorded and aborted.output.finish_reason == "abort"
    assert engine.stats()["kv_blocks_used"] == 0
