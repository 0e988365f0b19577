"""LoRA adapters served over one base model: each request runs with the adapter it names, in
the same batches as the others, and answers as the model with that adapter merged does."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jaxstack import datalib, nnlib
from jaxstack.serving import LLM, ConfigError, SamplingParams

TOKENIZER = datalib.ByteTokenizer()
ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=64)
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0)
PROMPT = "the quick brown fox jumps over the lazy dog, twice over"  # 3 full blocks of 16


def merged(config, folder) -> nnlib.Transformer:
    """The base model (seed 0) with the adapter merged into its kernels."""
    model = nnlib.Transformer(config, rngs=nnx.Rngs(0))
    nnlib.load_peft_adapter(model, folder)
    nnlib.merge_lora(model)
    return model


def greedy_reference(model, prompt: str, n: int) -> tuple[list[int], np.ndarray]:
    """nnlib.generate's tokens, and the log-probability the model gives each of them."""
    ids = np.array([TOKENIZER.encode(prompt)])
    tokens = nnlib.generate(model, ids, n)[0]
    apply, params = nnlib.as_function(model)
    logits, _ = jax.jit(apply)(params, tokens[None], np.arange(len(tokens))[None])
    logprobs = jax.nn.log_softmax(logits[0], axis=-1)
    new = tokens[ids.shape[1] :]
    chosen = logprobs[np.arange(ids.shape[1] - 1, len(tokens) - 1), new]
    return new.tolist(), np.asarray(chosen)


@pytest.fixture(scope="module")
def served(tiny_lm_config, tmp_path_factory, write_peft_adapter):
    folders = {
        "a": write_peft_adapter(tmp_path_factory.mktemp("a") / "adapter", tiny_lm_config, seed=1),
        "b": write_peft_adapter(
            tmp_path_factory.mktemp("b") / "adapter", tiny_lm_config, seed=2, modules=("o_proj",)
        ),
    }
    base = nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0))
    references = {None: greedy_reference(base, PROMPT, 10)}
    for name, folder in folders.items():
        references[name] = greedy_reference(merged(tiny_lm_config, folder), PROMPT, 10)
    llm = LLM(base, TOKENIZER, adapters=folders, **ENGINE)
    return llm, references


def test_requests_for_different_adapters_in_one_batch_answer_as_the_merged_models(served):
    llm, references = served
    assert len({tuple(tokens) for tokens, _ in references.values()}) == 3  # the adapters matter
    ids = TOKENIZER.encode(PROMPT)
    seqs = {name: llm.engine.add_request(ids, GREEDY, adapter=name)[0] for name in references}
    while llm.engine.has_unfinished():
        llm.engine.step()
    for name, (tokens, logprobs) in references.items():
        assert seqs[name].output.token_ids == tokens, name
        np.testing.assert_allclose(seqs[name].output.logprobs, logprobs, atol=2e-4)


def test_a_prefix_cached_under_one_adapter_is_not_reused_by_another(served, tiny_lm_config):
    llm, _ = served
    prompt = "a prompt of three blocks that no other test of this module sends"
    [first] = llm.generate([prompt], GREEDY, adapter="a")
    [again] = llm.generate([prompt], GREEDY, adapter="a")
    [base] = llm.generate([prompt], GREEDY)
    assert again.num_cached_tokens == 48  # the three full blocks a's first request computed
    assert base.num_cached_tokens == 0
    fresh = nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0))
    assert base.outputs[0].token_ids == greedy_reference(fresh, prompt, 10)[0]
    assert first.outputs[0].token_ids == again.outputs[0].token_ids


def test_an_unknown_adapter_is_refused_by_name(served):
    llm, _ = served
    with pytest.raises(Exception, match="no LoRA adapter 'c' is served"):
        llm.generate([PROMPT], GREEDY, adapter="c")


def test_an_adapter_for_another_model_is_refused_at_start(
    tiny_lm_config, tmp_path, write_peft_adapter
):
    wider = tiny_lm_config.replace(d_model=96)
    folder = write_peft_adapter(tmp_path / "adapter", wider, seed=1)
    base = nnlib.Transformer(tiny_lm_config, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="LoRA adapter 'wide'"):
        LLM(base, TOKENIZER, adapters={"wide": folder}, **ENGINE)
