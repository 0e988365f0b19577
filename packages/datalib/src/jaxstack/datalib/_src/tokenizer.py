"""The tokenizer protocol and the byte-level default tokenizer.

Everything in datalib that tokenizes works against `Tokenizer`, a small structural protocol, so a
user's own tokenizer plugs in without subclassing. Special tokens are not added by `encode`: the
pipeline adds `bos_id`/`eos_id` around each document itself, so that a tokenizer whose own
post-processor would also add them (many HF tokenizers do) never doubles them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tokenizer(Protocol):
    """What datalib needs from a tokenizer.

    `bos_id` may be None for vocabularies without a beginning-of-sequence token (GPT-2, Qwen):
    documents then start with their first real token.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def tokenize_text(tokenizer: Tokenizer, text: str) -> np.ndarray:
    """int32 ids of `text` (no bos/eos), through the tokenizer's vectorised path if it has one."""
    fast = getattr(tokenizer, "encode_array", None)
    if fast is not None:
        return fast(text)
    return np.asarray(tokenizer.encode(text), dtype=np.int32)


class ByteTokenizer:
    """UTF-8 bytes as tokens: no training, no files, any text round-trips exactly.

    Ids: 0 = pad, 1 = bos, 2 = eos, byte `b` -> `b + 3` (the ByT5 layout), so `vocab_size` is 259
    and zero-filled padding already is `pad_id`.

    >>> tok = ByteTokenizer()
    >>> tok.encode("hi")
    [107, 108]
    >>> tok.decode([1, 107, 108, 2])
    'hi'
    """

    OFFSET = 3

    @property
    def vocab_size(self) -> int:
        return 256 + self.OFFSET

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` as an int32 array without a Python list in between (the pipeline's path)."""
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        return raw.astype(np.int32) + self.OFFSET

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        arr = arr[(arr >= self.OFFSET) & (arr < self.vocab_size)] - self.OFFSET
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"
