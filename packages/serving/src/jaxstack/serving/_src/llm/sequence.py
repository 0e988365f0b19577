"""A Sequence: one prompt + one sample being generated, the unit the scheduler moves around.

A request with n > 1 becomes n sequences sharing a prompt: the first computes it, the others
are its `forks`, which take its KV when its prefill ends (the scheduler's `fork`) instead of
computing the prompt n times. `num_computed_tokens` counts tokens whose KV is in the cache or
being written by a launched step; the scheduler feeds the rest (a prefill chunk, or the last
sampled token) in the next step. Under async scheduling the last sampled token may still be
on the device (`num_pending`): the next step reads it there.
"""

from __future__ import annotations

import enum
import time

import numpy as np

from jaxstack.serving._src.llm.detokenizer import Detokenizer
from jaxstack.serving._src.llm.guided import GuidedDecoder
from jaxstack.serving._src.llm.outputs import CompletionOutput
from jaxstack.serving._src.llm.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def sampler_seed(seed: int) -> int:
    """A request's seed as the sampler's uint32 key seed. Seeds in [0, 2**32) stay as they
    are (their samples do not change); any other 64-bit seed, negative ones included, is
    hashed into that range, so no seed a client may send can overflow the sampler's array."""
    if 0 <= seed < 2**32:
        return seed
    return int(np.random.SeedSequence(seed % 2**64).generate_state(1)[0])


def sample_seeds(seed: int, n: int) -> list[int]:
    """The seeds of a request's `n` samples: its own for one sample; for several, each its own
    reproducible one, drawn from the request's seed in one call (20 us per call: a GRPO round
    of 16 prompts x 8 samples spent 2.5 ms drawing them one by one)."""
    if n == 1:
        return [seed]
    return np.random.SeedSequence(seed).generate_state(n).tolist()


class Sequence:
    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        seed: int,
        max_tokens: int,
        eos_token_ids: frozenset[int],
        detokenizer: Detokenizer | None,
        adapter: int = 0,
    ):
        self.request_id = request_id
        self.index = index
        self.seq_id = f"{request_id}-{index}"
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.seed = seed
        self.max_tokens = max_tokens
        self.eos_token_ids = eos_token_ids  # the tokenizer's eos and the model's other end tokens
        self.detokenizer = detokenizer
        self.adapter = adapter  # the LoRA adapter's number (0: the base model)
        self.output = CompletionOutput(index=index)
        if params.logprobs is not None:
            self.output.top_logprobs = []
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            [None] if params.prompt_logprobs is not None else None
        )
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_pending = 0  # tokens launched steps sample for it that are not recorded yet
        self.num_cached_tokens = 0
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # hashes of the full blocks of token_ids, in order
        self.num_keyed_blocks = 0  # of block_ids, the first ones checked into the prefix cache
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.error: BaseException | None = None  # why the engine failed it (finish "error")
        self.guided: GuidedDecoder | None = None  # structured output's matcher, if asked
        # The request's other samples, which may start from this one's prompt KV; a sample
        # that did is `parent`'s fork.
        self.forks: list[Sequence] = []
        self.parent: Sequence | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output.token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output.token_ids)

    def num_tokens_to_compute(self) -> int:
        """Tokens the next step may feed it: its uncomputed prompt and output tokens, those on
        the device included; none once the tokens on the device are its last."""
        if (
            self.num_computed_tokens >= len(self.prompt_token_ids)
            and len(self.output.token_ids) + self.num_pending >= self.max_tokens
        ):
            return 0
        return self.num_tokens + self.num_pending - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_token(
        self, token_id: int, logprob: float, top: dict[int, float] | None
    ) -> tuple[str, str | None]:
        """Record a sampled token; returns (new text, finish reason or None)."""
        out = self.output
        out.token_ids.append(token_id)
        out.logprobs.append(logprob)
        if out.top_logprobs is not None:
            out.top_logprobs.append(top or {})
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        if self.guided is not None:
            self.guided.take(token_id)
        new_text, stop = "", None
        may_stop = len(out.token_ids) >= self.params.min_tokens
        if self.detokenizer is not None:
            new_text, stop = self.detokenizer.add(out.token_ids, check_stop=may_stop)
        if stop is not None:
            self.finish("stop", stop)
        elif may_stop and token_id in self.params.stop_token_ids:
            self.finish("stop", token_id)
        elif self._ends_here(token_id, may_stop):
            self.finish("stop")
        elif len(out.token_ids) >= self.max_tokens:
            self.finish("length")
        if self.finished and stop is None and self.detokenizer is not None:
            new_text += self.detokenizer.flush()
        if self.detokenizer is not None:
            out.text = self.detokenizer.text
        return new_text, out.finish_reason

    def _ends_here(self, token_id: int, may_stop: bool) -> bool:
        """End-of-sequence (when it may stop), or a structured output that is complete."""
        eos = may_stop and token_id in self.eos_token_ids and not self.params.ignore_eos
        return eos or (self.guided is not None and self.guided.done)

    def banned_token_ids(self) -> list[int]:
        """Tokens the next sample may not be: before min_tokens, those that would stop it."""
        if len(self.output.token_ids) >= self.params.min_tokens:
            return []
        banned = list(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            banned += self.eos_token_ids
        return banned

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.output.finish_reason = reason
        self.output.stop_reason = stop_reason
        self.status = Status.FINISHED
