"""LLMEngine: the step loop. Schedule, run the model, record the sampled tokens, free.

    batch = scheduler.schedule()          # who runs, how many tokens each
    step = runner.launch(batch, previous) # one jitted forward + sampling, not waited for
    for seq in previous: append its token, check stops, release it when finished

Requests come in through `add_request` (a prompt's token ids and SamplingParams; n > 1
becomes n sequences) and leave through the `SequenceUpdate`s that `step` returns.

Async scheduling (vLLM V1's, on by default): each `step` launches the next step before it
records the previous one's tokens, so the host's work (recording tokens, stop checks, text,
the next step's inputs) runs while the device computes. A decode reads its input token from
the previous step's sampled tokens on the device. A sequence whose stop string or EOS ends it
in the recorded step has already been fed to the launched one: that one's token for it is
dropped. Requests whose sampling needs their tokens on the host (penalties, logit_bias,
min_tokens, structured output) make the step wait for the previous one first.

A request that makes a step fail (an exception while its inputs are prepared or its token
recorded) fails alone: its sequences finish with reason "error" (`Sequence.error` says why)
and free their blocks, the step is run again without it, and every other request goes on as
if it had never been there.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack.serving._src.errors import ConfigError, InvalidFieldError, InvalidInputError
from jaxstack.serving._src.llm.block_manager import BlockManager
from jaxstack.serving._src.llm.detokenizer import Detokenizer
from jaxstack.serving._src.llm.guided import GuidedDecoder
from jaxstack.serving._src.llm.lora import attach_adapters
from jaxstack.serving._src.llm.model_runner import LaunchedStep, ModelRunner, StepResult
from jaxstack.serving._src.llm.sampling_params import SamplingParams
from jaxstack.serving._src.llm.scheduler import ScheduledBatch, Scheduler
from jaxstack.serving._src.llm.sequence import Sequence, sample_seeds, sampler_seed


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Engine options (vLLM's names).

    Attributes:
      max_model_len: longest prompt + output (default: the model's max_seq_len).
      block_size: token slots per KV block.
      num_blocks: KV blocks in the cache (default: room for max_num_seqs full-length
        sequences, plus the null block, within kv_cache_memory_bytes).
      kv_cache_memory_bytes: most bytes the K and V caches take when num_blocks is not given
        (default 4 GiB, vLLM's CPU default): an HF config's 32k-128k positions would otherwise
        ask for max_num_seqs full-length caches before the first request.
      max_num_seqs: sequences running at once.
      max_num_batched_tokens: tokens per step (prefill chunks + decodes); 2,048 as vLLM's:
        32 prompts of 128 tokens all have their first token 0.65x as soon as with 256
        (benchmarks/serving-llm/README.md), at the same decode speed.
      enable_prefix_caching: reuse the KV of shared prompt prefixes.
      max_logprobs: most alternatives a request may ask for per token.
      seed: seed of the random seeds given to requests that bring none.
      async_scheduling: launch each step before the previous one's tokens are recorded
        (vLLM's `--async-scheduling`); False waits for every step before the next.
    """

    max_model_len: int | None = None
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_bytes: int = 4 * 2**30
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    max_logprobs: int = 20
    seed: int = 0
    async_scheduling: bool = True


@dataclasses.dataclass
class SequenceUpdate:
    """What one step did to one sequence (new tokens are at most one per step)."""

    seq: Sequence
    new_token_ids: list[int]
    new_text: str
    finished: bool


@dataclasses.dataclass
class _InFlight:
    """A launched step, with what the engine needs to record it."""

    batch: ScheduledBatch
    step: LaunchedStep
    starts: list[int]  # each sequence's num_computed_tokens before the step
    ends: list[bool]  # whether the step computes the sequence's last known token

    def samples(self, i: int) -> bool:
        """Whether the step samples a token for its i-th sequence."""
        return self.ends[i] and self.batch.seqs[i].max_tokens > 0

    def overlappable(self) -> bool:
        """Whether the next step may launch before this one is recorded: no sequence it
        samples for needs its tokens on the host to sample the next (penalties, biases)."""
        return not any(
            self.samples(i) and q.params.adjusts_logits for i, q in enumerate(self.batch.seqs)
        )


def kv_block_bytes(model_config: Any, block_size: int) -> int:
    """Bytes of one KV block: keys and values of block_size tokens in every layer."""
    c = model_config
    per_token = c.num_layers * c.num_kv_heads * c.head_dim * jnp.dtype(c.dtype).itemsize
    return 2 * block_size * per_token


class LLMEngine:
    """The LLM engine's step loop over a paged KV cache with continuous batching (vLLM's design).

    `add_request(prompt_token_ids, params)` queues a prompt as `params.n` sequences; each `step()`
    schedules the running sequences, runs one jitted forward and sampling over the batch and
    returns a `SequenceUpdate` per sequence; `abort(request_id)` cancels. A request that makes a
    step fail finishes alone with reason "error"; the others go on. `LLM` and `jaxstack-serve`
    are built on it.

    Args:
      model: an nnlib Transformer.
      tokenizer: a datalib tokenizer for stop strings and text (None: token ids only).
      config: the `EngineConfig` (batch limits, KV-cache blocks, max_model_len, seed).
      eos_token_ids: tokens that end a sequence besides the tokenizer's eos, such as a chat
        model's end-of-turn (generation_config.json's `eos_token_id`, as transformers and
        vLLM stop on it).
      adapters: LoRA adapters to serve over the model, name -> PEFT folder
        (adapter_config.json + adapter_model.safetensors); a request picks one by name
        (`add_request(..., adapter=name)`). They are attached to `model` (not merged).
    """

    def __init__(
        self,
        model: nnx.Module,
        tokenizer: Any = None,
        config: EngineConfig = EngineConfig(),
        *,
        eos_token_ids: Iterable[int] = (),
        adapters: Mapping[str, str | os.PathLike] | None = None,
    ):
        eos = getattr(tokenizer, "eos_id", None)
        self.eos_token_ids = frozenset(eos_token_ids) | ({eos} if eos is not None else set())
        c = config
        max_model_len = c.max_model_len or model.config.max_seq_len
        blocks_per_seq = -(-max_model_len // c.block_size)
        num_blocks = c.num_blocks or min(
            c.max_num_seqs * blocks_per_seq + 1,
            c.kv_cache_memory_bytes // kv_block_bytes(model.config, c.block_size),
        )
        if num_blocks - 1 < blocks_per_seq:
            option, setting = (
                ("num_blocks", num_blocks)
                if c.num_blocks
                else ("kv_cache_memory_bytes", f"{c.kv_cache_memory_bytes} ({num_blocks} blocks)")
            )
            raise ConfigError(
                f"{option}={setting} cannot hold one sequence of max_model_len={max_model_len} "
                f"({blocks_per_seq} blocks of {c.block_size} plus the null block); raise "
                f"{option} or lower max_model_len"
            )
        if c.max_num_batched_tokens < c.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens={c.max_num_batched_tokens} must be >= max_num_seqs="
                f"{c.max_num_seqs} (every running sequence needs a token per step)"
            )
        self.config = dataclasses.replace(c, max_model_len=max_model_len, num_blocks=num_blocks)
        self.adapters = {name: str(folder) for name, folder in (adapters or {}).items()}
        self.adapter_names = attach_adapters(model, self.adapters)
        self.model_config = model.config
        self.tokenizer = tokenizer
        self.blocks = BlockManager(
            num_blocks, c.block_size, enable_prefix_caching=c.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.blocks,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
        )
        self.runner = ModelRunner(
            model,
            num_blocks=num_blocks,
            block_size=c.block_size,
            max_model_len=max_model_len,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            max_logprobs=c.max_logprobs,
        )
        self._seeds = np.random.default_rng(c.seed)
        self._ids = itertools.count()
        self.sequences: dict[str, list[Sequence]] = {}
        self.in_flight: _InFlight | None = None  # the launched step not recorded yet
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    # ------------------------------------------------------------------------ requests
    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Validate a request against the model; returns its effective max_tokens."""
        n_prompt = len(prompt_token_ids)
        limit = self.config.max_model_len
        vocab = self.model_config.vocab_size
        if n_prompt == 0:
            raise InvalidFieldError("prompt", "prompt is empty; send at least one token")
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise InvalidFieldError("prompt", f"prompt token ids must be in [0, {vocab})")
        if any(t >= vocab for t in params.logit_bias):
            raise InvalidFieldError("logit_bias", f"logit_bias keys must be token ids < {vocab}")
        if params.structured_output is not None:
            params.structured_output.check(has_tokenizer=self.tokenizer is not None)
        if n_prompt >= limit and not (n_prompt == limit and params.max_tokens == 0):
            raise InvalidFieldError(
                "prompt",
                f"prompt has {n_prompt} tokens but the context is {limit} (max_model_len); "
                "shorten the prompt",
            )
        max_tokens = limit - n_prompt if params.max_tokens is None else params.max_tokens
        if n_prompt + max_tokens > limit:
            raise InvalidFieldError(
                "max_tokens",
                f"max_tokens={max_tokens} plus {n_prompt} prompt tokens exceed the context of "
                f"{limit} (max_model_len); lower max_tokens to at most {limit - n_prompt}",
            )
        for name, k in (("logprobs", params.logprobs), ("prompt_logprobs", params.prompt_logprobs)):
            if k is not None and k > self.config.max_logprobs:
                raise InvalidFieldError(
                    name, f"{name}={k} exceeds the server's max_logprobs={self.config.max_logprobs}"
                )
        return max_tokens

    def adapter_number(self, adapter: str | None) -> int:
        """The number of a served LoRA adapter (0 for None, the base model)."""
        if adapter is None:
            return 0
        if adapter not in self.adapter_names:
            served = ", ".join(self.adapter_names) or "none"
            raise InvalidInputError(f"no LoRA adapter {adapter!r} is served (served: {served})")
        return self.adapter_names.index(adapter) + 1

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        adapter: str | None = None,
    ) -> list[Sequence]:
        """Queue a prompt; returns its n sequences (index 0..n-1). `adapter` names the LoRA
        adapter to run it with (None: the base model)."""
        max_tokens = self.check_request(prompt_token_ids, params)
        number = self.adapter_number(adapter)
        request_id = request_id or str(next(self._ids))
        if request_id in self.sequences:
            raise InvalidInputError(f"request id {request_id!r} is already running")
        if params.top_k > self.model_config.vocab_size:  # the whole vocabulary: no limit
            params = params.replace(top_k=0)
        base = (
            int(self._seeds.integers(2**32)) if params.seed is None else sampler_seed(params.seed)
        )
        seqs = []
        for i, seed in enumerate(sample_seeds(base, params.n)):
            detok = None
            if self.tokenizer is not None and params.detokenize:
                detok = Detokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output)
            seq = Sequence(
                request_id,
                i,
                prompt_token_ids,
                params,
                seed=seed,
                max_tokens=max_tokens,
                eos_token_ids=self.eos_token_ids,
                detokenizer=detok,
                adapter=number,
            )
            if params.structured_output is not None:
                vocab = self.model_config.vocab_size
                seq.guided = GuidedDecoder(params.structured_output, self.tokenizer, vocab)
            seqs.append(seq)
            self.scheduler.add(seq)
        if params.prompt_logprobs is None and max_tokens > 0:  # one prefill for all n
            seqs[0].forks = seqs[1:]
        self.sequences[request_id] = seqs
        self.num_prompt_tokens += len(prompt_token_ids)
        return seqs

    def abort(self, request_id: str) -> int:
        """Cancel a request: its unfinished sequences end with finish_reason "abort" and free
        their blocks. Returns how many were cancelled."""
        cancelled = 0
        for seq in self.sequences.pop(request_id, []):
            if not seq.finished:
                seq.finish("abort")
                self.scheduler.finish(seq)
                cancelled += 1
        return cancelled

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self.in_flight is not None

    # ---------------------------------------------------------------------------- step
    def step(self) -> list[SequenceUpdate]:
        """Launch the next step and record the one before (async scheduling), or run one
        step and record it; returns what the recorded step did to each sequence."""
        previous, self.in_flight = self.in_flight, None
        updates = []
        if previous is not None and not previous.overlappable():
            updates += self._record(previous)
            previous = None
        batch = self.scheduler.schedule()
        launched = None
        if batch.seqs:
            try:
                launched = self._launch(batch, previous)
            except Exception as e:
                if self.runner.k.is_deleted():  # the step consumed the KV cache: no retry
                    raise
                if previous is not None:  # retry without tokens on the device
                    updates += self._record(previous)
                    previous = None
                    batch = batch.rows([i for i, q in enumerate(batch.seqs) if not q.finished])
                updates += self._run_isolated(batch, e)
        if previous is not None:
            updates += self._record(previous)
        if launched is not None:
            if self.config.async_scheduling:
                self.in_flight = launched
            else:
                updates += self._record(launched)
        return updates

    def _run_isolated(self, batch: ScheduledBatch, error: Exception) -> list[SequenceUpdate]:
        """After `batch` failed to launch with `error`: run it again one request at a time,
        waiting for each, so that only a request that fails is failed."""
        requests = list(dict.fromkeys(q.request_id for q in batch.seqs))
        if len(requests) == 1:
            return self._fail(requests[0], error)
        updates = []
        for request_id in requests:
            alone = batch.rows([i for i, q in enumerate(batch.seqs) if q.request_id == request_id])
            try:
                updates += self._record(self._launch(alone, None))
            except Exception as e:
                if self.runner.k.is_deleted():
                    raise
                updates += self._fail(request_id, e)
        return updates

    def _launch(self, batch: ScheduledBatch, previous: _InFlight | None) -> _InFlight:
        """Launch `batch`; once launched, its tokens count as computed, and each sequence it
        samples for has one more token pending."""
        step = self.runner.launch(batch, None if previous is None else previous.step)
        starts = [q.num_computed_tokens for q in batch.seqs]
        ends = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            ends.append(seq.num_computed_tokens == seq.num_tokens + seq.num_pending)
            seq.num_pending += ends[-1] and seq.max_tokens > 0
        return _InFlight(batch, step, starts, ends)

    def _record(self, launched: _InFlight) -> list[SequenceUpdate]:
        """Wait for a launched step and record what it computed and sampled."""
        result = launched.step.result()
        updates = []
        batch = launched.batch
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            seq.num_pending -= launched.samples(i)
            if seq.finished:  # finished by an earlier step, an abort or a failed sibling
                continue
            try:
                update = self._advance(seq, n, i, launched.starts[i], launched.ends[i], result)
            except Exception as e:
                updates += self._fail(seq.request_id, e)
                continue
            if update is not None:
                updates.append(update)
        return updates

    def _fail(self, request_id: str, error: Exception) -> list[SequenceUpdate]:
        """Finish a request's unfinished sequences with reason "error" and free them."""
        updates = []
        for seq in self.sequences.pop(request_id, []):
            if not seq.finished:
                seq.error = error
                seq.finish("error")
                self.scheduler.finish(seq)
                updates.append(SequenceUpdate(seq, [], "", True))
        return updates

    def _advance(
        self, seq: Sequence, n: int, i: int, start: int, end: bool, result: StepResult
    ) -> SequenceUpdate | None:
        if seq.prompt_logprobs is not None and result.prompt is not None:
            self._record_prompt_logprobs(seq, n, start, result.row_offsets[i], result.prompt)
        if not end:
            self.blocks.cache_full_blocks(seq)
            return None  # a prefill chunk: nothing to sample yet
        if seq.max_tokens == 0:
            seq.finish("length")
            new_ids, text = [], ""
        else:
            s = result.sampled
            token = int(s.token_ids[i])
            top = None
            if seq.params.logprobs:
                k = seq.params.logprobs
                top = dict(
                    zip(s.top_ids[i, :k].tolist(), s.top_logprobs[i, :k].tolist(), strict=True)
                )
            text, _ = seq.append_token(token, float(s.logprobs[i]), top)
            new_ids = [token]
            self.num_generation_tokens += 1
            if not seq.finished and seq.num_tokens >= self.config.max_model_len:
                seq.finish("length")
        self.blocks.cache_full_blocks(seq)
        if seq.finished:
            self.scheduler.finish(seq)
            if all(q.finished for q in self.sequences.get(seq.request_id, [])):
                self.sequences.pop(seq.request_id, None)
        return SequenceUpdate(seq, new_ids, text, seq.finished)

    def _record_prompt_logprobs(self, seq: Sequence, n: int, start: int, row: int, scores):
        last = min(start + n, len(seq.prompt_token_ids) - 1)  # rows that predict a prompt token
        k = seq.params.prompt_logprobs
        # After a preemption the prompt is recomputed: skip the positions already recorded.
        for j in range(max(start, len(seq.prompt_logprobs) - 1), last):
            r = row + j - start
            entry = dict(
                zip(
                    scores.top_ids[r, :k].tolist(), scores.top_logprobs[r, :k].tolist(), strict=True
                )
            )
            entry[seq.prompt_token_ids[j + 1]] = float(scores.logprobs[r])
            seq.prompt_logprobs.append(entry)

    # --------------------------------------------------------------------------- state
    def update_weights(self, params: Any) -> None:
        """Serve new parameter values from now on; cached prefixes are dropped (stale KV)."""
        self.runner.update_weights(params)
        self.blocks.reset_prefix_cache()

    def stats(self) -> dict[str, float]:
        b = self.blocks
        return {
            "num_requests_running": len(self.scheduler.running),
            "num_requests_waiting": len(self.scheduler.waiting),
            "kv_blocks_used": b.num_used_blocks,
            "kv_blocks_free": b.num_free_blocks,
            "prefix_cache_queries": b.prefix_queries,
            "prefix_cache_hits": b.prefix_hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "prompt_tokens": self.num_prompt_tokens,
            "generation_tokens": self.num_generation_tokens,
        }
