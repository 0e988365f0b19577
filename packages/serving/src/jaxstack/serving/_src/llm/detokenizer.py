"""Incremental detokenization with stop strings, safe for streaming.

Each step decodes only a window of the sequence's newest output tokens, not the whole output
(vLLM's prefix/read offsets): the window starts at the last token whose text was complete, so
decoding it twice, without and with the new tokens, gives the new text as the difference,
whatever the tokenizer does at the start of a text (a SentencePiece leading space). A step's
cost is then independent of how long the sequence already is.

Only text that can no longer change is released: a trailing U+FFFD (a multi-byte character
cut between tokens) and a tail that could still grow into a stop string are held back until
the next token settles them, so a streamed client never sees text that is later taken back.
"""

from __future__ import annotations

from collections.abc import Sequence

_INCOMPLETE = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer, stop: Sequence[str] = (), include_stop: bool = False):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.include_stop = include_stop
        self._full = ""  # the decoded output: committed text + the window's newest text
        self._committed = ""  # text of the tokens before `_read`, settled
        self._prefix = 0  # the window starts here (tokens before it are in `_committed`)
        self._read = 0  # tokens before this are in `_committed`
        self.text = ""  # released so far

    def add(self, token_ids: Sequence[int], *, check_stop: bool = True) -> tuple[str, str | None]:
        """Decode after new tokens; returns (newly released text, matched stop string).
        Without `check_stop` (before min_tokens), stop strings are neither matched nor held
        back: that text is released as it is, and a later match starts after it."""
        self._full = full = self._decode(token_ids)
        if not check_stop:
            return self._release(len(full.rstrip(_INCOMPLETE))), None
        if self.stop:
            # Held-back tails guarantee that a stop string starts after the released text.
            hits = [(i, s) for s in self.stop if (i := full.find(s, len(self.text))) >= 0]
            if hits:
                i, s = min(hits)
                return self._release(i + len(s) if self.include_stop else i), s
        end = len(full.rstrip(_INCOMPLETE))
        end -= max(
            (k for s in self.stop for k in range(1, len(s)) if full[:end].endswith(s[:k])),
            default=0,
        )
        return self._release(end), None

    def _decode(self, token_ids: Sequence[int]) -> str:
        """The whole output's text, from a decode of the window [_prefix:] only."""
        before = self.tokenizer.decode(token_ids[self._prefix : self._read])
        now = self.tokenizer.decode(token_ids[self._prefix :])
        new = now[len(before) :]
        if new.endswith(_INCOMPLETE) or len(now) <= len(before):
            return self._committed + new  # unsettled: decode the same window next time
        self._committed += new
        self._prefix, self._read = self._read, len(token_ids)
        return self._committed

    def flush(self) -> str:
        """Release everything held back (the sequence ended for another reason)."""
        return self._release(len(self._full))

    def _release(self, end: int) -> str:
        if end <= len(self.text):
            return ""
        delta = self._full[len(self.text) : end]
        self.text = self._full[:end]
        return delta
