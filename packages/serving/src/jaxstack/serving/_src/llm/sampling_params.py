"""SamplingParams: how one request's tokens are chosen and when its generation stops.

Names and defaults follow vLLM (and so the OpenAI API the server speaks), so that code written
against either reads the same here. Every field is validated on construction with a message
naming the field, because the server hands these messages straight back as HTTP 400 bodies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from jaxstack.serving._src.errors import InvalidFieldError
from jaxstack.serving._src.llm.guided import StructuredOutput


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping settings.

    Attributes:
      n: completions per prompt (each its own sequence; they share the prompt's cached blocks).
      temperature: 0 is greedy (argmax); otherwise logits are divided by it before sampling.
      top_k: keep the k most likely tokens (0 or -1: all).
      top_p: keep the smallest set of tokens whose probability sums to at least top_p.
      min_p: drop tokens less likely than min_p times the most likely one.
      seed: makes sampling reproducible for this request, whatever else is in the batch; any
        64-bit integer, signed or not (the engine folds it into the sampler's 32 bits).
      max_tokens: tokens to generate at most (0: score the prompt only, see prompt_logprobs).
      stop: strings that end generation (not included in the text unless
        include_stop_str_in_output).
      stop_token_ids: token ids that end generation (the token stays in token_ids).
      min_tokens: tokens to generate before end-of-sequence, stop_token_ids or stop strings may
        end the output (they are masked out of the sampling until then, as in vLLM).
      logit_bias: token id -> value in [-100, 100] added to its logit before sampling
        (OpenAI's logit_bias; -100 bans a token in practice, 100 forces it).
      structured_output: a grammar the output must follow (JSON, a JSON Schema, a regex, a
        choice of strings, a Lark grammar); tokens that would break it are never sampled.
      ignore_eos: keep going past the tokenizer's end-of-sequence token.
      presence_penalty, frequency_penalty: OpenAI's penalties on tokens already generated.
      repetition_penalty: CTRL's penalty (>1 discourages) on tokens in the prompt or output.
      logprobs: also return the top-`logprobs` alternatives of every generated token (the
        sampled token's own log-probability is always returned).
      prompt_logprobs: return the prompt tokens' log-probabilities with this many
        alternatives each (0: only the prompt token's own).
      detokenize: build the output's text as tokens arrive (vLLM's option). False leaves
        `text` empty and skips the incremental decoding, a host cost per token that a caller
        decoding whole outputs itself (an RL rollout) does not need; stop strings need it.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    min_tokens: int = 0
    logit_bias: Mapping[int, float] = dataclasses.field(default_factory=dict)
    structured_output: StructuredOutput | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        bias = {int(t): float(v) for t, v in self.logit_bias.items()}
        object.__setattr__(self, "logit_bias", bias)
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        checks = (
            ("n", self.n >= 1, "must be >= 1"),
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_k", self.top_k >= 0, "must be >= 1, or 0/-1 for no limit"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            (
                "seed",
                self.seed is None or (isinstance(self.seed, int) and -(2**63) <= self.seed < 2**64),
                "must be a 64-bit integer",
            ),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 0, "must be >= 0"),
            (
                "min_tokens",
                0 <= self.min_tokens <= (self.max_tokens if self.max_tokens is not None else 2**62),
                "must be >= 0 and at most max_tokens",
            ),
            (
                "logit_bias",
                all(t >= 0 and -100 <= v <= 100 for t, v in self.logit_bias.items()),
                "must map token ids >= 0 to values in [-100, 100]",
            ),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0, "must be > 0"),
            ("logprobs", self.logprobs is None or self.logprobs >= 0, "must be >= 0"),
            (
                "prompt_logprobs",
                self.prompt_logprobs is None or self.prompt_logprobs >= 0,
                "must be >= 0",
            ),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
            (
                "detokenize",
                self.detokenize or not self.stop,
                "cannot match stop strings, which are found in the text; keep detokenize=True",
            ),
        )
        for name, ok, why in checks:
            if not ok:
                raise InvalidFieldError(name, f"{name}={getattr(self, name)!r} {why}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )

    @property
    def adjusts_logits(self) -> bool:
        """Whether the sampler needs this request's per-token logit inputs (penalties,
        logit_bias, min_tokens, structured output)."""
        return (
            self.has_penalties
            or bool(self.logit_bias)
            or self.min_tokens > 0
            or self.structured_output is not None
        )

    def replace(self, **changes) -> SamplingParams:
        return dataclasses.replace(self, **changes)
