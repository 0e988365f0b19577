"""Rollouts from the serving engine, in the same process, with weights handed over in memory.

`EngineSampler` is the one seam between the RL loops and generation: `update_weights(params)`
before each round of sampling (the trainer's current params, LoRA merged, moved onto the
rollout role's mesh with `jax.device_put`: no disk), and
`start(prompt_ids, ...)` (queue the prompts, launch the first engine step, do not wait) then
`finish(...)`, giving each prompt's `n` completions. Seeds are derived from the run's
seed, the iteration and the prompt's position, so a resumed run samples what an uninterrupted
one would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxstack.rl._src.encode import Encoder
from jaxstack.rl._src.placement import Placement
from jaxstack.rl._src.policy import Policy


@dataclasses.dataclass
class Completions:
    """One round of sampling: row i*n + j is completion j of prompt i."""

    token_ids: list[np.ndarray]
    texts: list[str]
    num_tokens: int


# The most tokens one engine step takes: vLLM's default chunk for chunked prefill.
MAX_STEP_TOKENS = 8192


def step_token_budget(max_num_seqs: int, prefill_tokens: int) -> int:
    """Tokens an engine step may take: a round's whole prefill (`prefill_tokens`, all its
    prompts' tokens) up to MAX_STEP_TOKENS, at least 256 and one per sequence.

    A budget below the round's prefill splits it over several steps of varying (tokens,
    sequences) shapes, each a program to compile: a tiny GRPO round (128 completions of
    12-token prompts) took 7.3 engine steps on a 256-token budget and compiled 9 step
    programs in 40 iterations; with its prefill in one step, 4.1 and 5.
    """
    return max(256, max_num_seqs, min(prefill_tokens, MAX_STEP_TOKENS))


class EngineSampler:
    """jaxstack.serving's `LLM` engine serving a copy of the policy without adapters, its
    weights on the rollout role's mesh (`placement`); `prefill_tokens` (the prompt tokens of
    one round of sampling) sizes its steps so that a round's prefill is one step."""

    def __init__(
        self,
        policy: Policy,
        placement: Placement,
        *,
        max_model_len: int,
        max_num_seqs: int,
        seed: int,
        prefill_tokens: int = 0,
    ):
        from flax import nnx

        from jaxstack.serving import LLM

        self.policy = policy
        self.seed = seed
        model = policy.base_model()
        weights = nnx.state(model, nnx.Param)
        # computed once: the weights handed over each iteration keep the same layout
        self.shardings = placement.param_shardings(weights)
        nnx.update(model, jax.device_put(weights, self.shardings))
        self.llm = LLM(
            model,
            policy.tokenizer,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=step_token_budget(max_num_seqs, prefill_tokens),
            enable_prefix_caching=True,
            seed=seed,
        )

    def update_weights(self, params: Any) -> None:
        served = self.policy.served_params(params)
        # Weights already laid out as the engine's (an actor on the rollout's mesh) go as they
        # are: `jax.device_put` checks each leaf anyway, 0.6 ms a call at d_model 64.
        layouts = zip(jax.tree.leaves(served), jax.tree.leaves(self.shardings), strict=True)
        if not all(a.sharding == sharding for a, sharding in layouts):
            served = jax.device_put(served, self.shardings)
        self.llm.update_weights(served)

    def start(
        self,
        prompt_ids: Sequence[np.ndarray],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        iteration: int,
    ) -> list[list[Any]]:
        """Queue the prompts and launch the engine's first step without waiting for it (its
        inputs may still be computing, as the params of an update just launched); `finish`
        samples the rest. Returns each prompt's sequences."""
        from jaxstack.serving import SamplingParams

        engine = self.llm.engine
        started = []
        for i, prompt in enumerate(prompt_ids):
            params = SamplingParams(
                n=n,
                temperature=temperature,
                top_k=top_k or 0,
                max_tokens=max_new_tokens,
                seed=int(np.random.SeedSequence([self.seed, iteration, i]).generate_state(1)[0]),
                detokenize=False,
            )
            started.append(engine.add_request([int(t) for t in prompt], params))
        engine.step()
        return started

    def finish(self, started: list[list[Any]]) -> Completions:
        """Run the engine until the `start`ed sequences are complete; their completions."""
        engine = self.llm.engine
        while engine.has_unfinished():
            engine.step()
        failed = [q.error for seqs in started for q in seqs if q.error is not None]
        if failed:  # the engine fails a request alone; a round needs every completion
            raise failed[0]
        token_ids = [q.output.token_ids for seqs in started for q in seqs]
        return Completions(
            [np.asarray(t, np.int32) for t in token_ids],
            self._decode(token_ids),
            sum(len(t) for t in token_ids),
        )

    def _decode(self, token_ids: Sequence[Sequence[int]]) -> list[str]:
        """Whole completions decoded once: the engine samples without detokenizing, which
        would decode each completion again at every token (the text is the same)."""
        return [self.policy.tokenizer.decode(t) for t in token_ids]

    def greedy_fn(
        self, params: Any, encoder: Encoder, max_new_tokens: int
    ) -> Callable[[Sequence[str]], list[str]]:
        """`generate(prompts) -> completions`: greedy under `params`, for an evaluation."""
        from jaxstack.serving import SamplingParams

        def generate(prompts: Sequence[str]) -> list[str]:
            self.update_weights(params)
            outputs = self.llm.generate(
                [[int(t) for t in encoder.prompt(p)] for p in prompts],
                SamplingParams(temperature=0.0, max_tokens=max_new_tokens, detokenize=False),
            )
            return self._decode([request.outputs[0].token_ids for request in outputs])

        return generate
