"""What `LLM.generate` returns: one RequestOutput per prompt, one CompletionOutput per sample."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CompletionOutput:
    """One generated sequence.

    Attributes:
      index: which of the request's `n` samples this is.
      text: the detokenized output (cut before a matched stop string).
      token_ids: the generated token ids.
      logprobs: per generated token, the log-probability of the sampled token under the
        model's raw distribution (before temperature and filtering), always filled: RL needs it.
      top_logprobs: per generated token, {token_id: logprob} of the `SamplingParams.logprobs`
        most likely tokens; None unless asked.
      finish_reason: "stop" (EOS, a stop token or string), "length" (max_tokens or the
        context), "abort" (cancelled), or None while running.
      stop_reason: the stop string or token id that ended it, else None.
    """

    index: int
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestOutput:
    """A prompt and its completions.

    Attributes:
      prompt_logprobs: when asked, per prompt token {token_id: logprob} holding the prompt
        token itself and the top alternatives; the first entry is None (nothing precedes it).
      num_cached_tokens: prompt tokens whose KV came from the prefix cache.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list[dict[int, float] | None] | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)
