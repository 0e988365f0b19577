"""Structured output: a grammar that every sampled token must keep valid (llguidance).

A request asks for JSON (any object, or one matching a JSON Schema), a regular expression, one
of a list of strings, or a Lark grammar. llguidance, the grammar engine vLLM also uses, turns it
into a matcher over the model's tokenizer; before each step the matcher gives the set of tokens
that keep the output valid, the engine bans the others through the sampler's bias (-inf, inside
the jitted step), and after the step the sampled token is fed back. When the grammar is complete
only end-of-sequence remains allowed, so the output ends there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any, Literal

import llguidance
import numpy as np

from jaxstack.serving._src.errors import InvalidFieldError

StructuredKind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]


@dataclasses.dataclass(frozen=True)
class StructuredOutput:
    """What the output must be, for `SamplingParams(structured_output=...)`.

    Attributes:
      kind: "json_object" (any JSON object), "json_schema" (`value`: the schema, a dict),
        "regex" (`value`: the pattern), "choice" (`value`: the strings allowed) or "grammar"
        (`value`: a Lark grammar, as llguidance reads it).
      param: the request field it came from, named in errors.

    Example:
      >>> schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
      >>> SamplingParams(structured_output=StructuredOutput("json_schema", schema))
    """

    kind: StructuredKind
    value: Any = None
    param: str = "structured_output"

    def check(self, *, has_tokenizer: bool = True) -> None:
        """Raise InvalidFieldError if the grammar is not valid (checked without a tokenizer)
        or the model has no tokenizer to match it with."""
        if not has_tokenizer:
            raise InvalidFieldError(self.param, "structured output needs the model's tokenizer")
        try:
            grammar = self.grammar()
        except (ValueError, TypeError) as e:
            raise InvalidFieldError(self.param, f"'{self.param}' is not valid: {e}") from None
        problem = llguidance.LLMatcher.validate_grammar(grammar)
        if problem and not problem.startswith("WARNING"):
            raise InvalidFieldError(self.param, f"'{self.param}' is not valid: {problem}")

    def grammar(self) -> str:
        """The llguidance grammar of this request."""
        # JSON without free whitespace between tokens (", " and ": " only): a model that is
        # unsure cannot spend its tokens on blanks, and the text parses the same.
        compact = {"whitespace_flexible": False}
        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, compact)
        if self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(self.value), compact)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            pattern = "|".join(f"({re.escape(c)})" for c in self.value)
            return llguidance.LLMatcher.grammar_from_regex(pattern)
        return llguidance.LLMatcher.grammar_from_lark(self.value)


class _ByteTokens:
    """datalib's ByteTokenizer (no tokenizer.json) as llguidance's TokenizerWrapper reads a
    tokenizer: the bytes of every token id, and the special ids."""

    def __init__(self, tokenizer: Any):
        offset = tokenizer.OFFSET
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = list(range(offset))
        self.tokens = [b""] * offset + [bytes([b]) for b in range(256)]
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            return [b + self._tokenizer.OFFSET for b in text]
        return self._tokenizer.encode(text)


@functools.cache
def _ll_tokenizer(tokenizer: Any, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` (built once: about a second for a large vocabulary)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        source: Any = backend.to_str()
    else:
        source = llguidance.TokenizerWrapper(_ByteTokens(tokenizer))
    return llguidance.LLTokenizer(source, n_vocab=vocab_size, eos_token=tokenizer.eos_id)


class GuidedDecoder:
    """One sequence's matcher: the tokens it allows next, and the tokens it has taken."""

    def __init__(self, wanted: StructuredOutput, tokenizer: Any, vocab_size: int):
        ll = _ll_tokenizer(tokenizer, vocab_size)
        try:
            self.matcher = llguidance.LLMatcher(ll, wanted.grammar(), log_level=0)
        except (ValueError, TypeError) as e:
            message = f"'{wanted.param}' is not a valid grammar: {e}"
            raise InvalidFieldError(wanted.param, message) from None
        if self.matcher.is_error():
            raise InvalidFieldError(
                wanted.param, f"'{wanted.param}' is not a valid grammar: {self.matcher.get_error()}"
            )
        self.vocab_size = vocab_size

    def allowed(self) -> np.ndarray:
        """[vocab_size] bool: the tokens that keep the output valid."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)

    def take(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)

    @property
    def done(self) -> bool:
        """The grammar is complete (nothing more may follow)."""
        return self.matcher.is_stopped()
