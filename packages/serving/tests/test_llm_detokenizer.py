"""The streaming detokenizer: the text it releases token by token is the whole output's decode,
stop strings cut it where they start, and each step decodes a window of the newest tokens
instead of the whole output (its cost does not grow with the sequence)."""

from __future__ import annotations

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from jaxstack import datalib
from jaxstack.serving._src.llm.detokenizer import Detokenizer

TEXTS = [
    "the quick brown fox jumps over the lazy dog, and the dog sleeps on",
    "héllo wörld: naïve café, déjà vu, 日本語のテキスト, emoji 🙂🚀 and more text",
    "def decode(self, ids): return ''.join(chr(i) for i in ids)  # some code",
] * 4
SPECIAL = ["<pad>", "<s>", "</s>"]


def sentencepiece_like() -> datalib.BPETokenizer:
    """A BPE whose decoder drops the text's leading space (Llama's Metaspace), so a window's
    decode differs from its place in the whole text."""
    tok = tokenizers.Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL + bytes_)
    tok.train_from_iterator(TEXTS, trainer=trainer)
    return datalib.BPETokenizer(tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


TOKENIZERS = {
    "bytes": datalib.ByteTokenizer,
    "byte-level-bpe": lambda: datalib.BPETokenizer.train(TEXTS, vocab_size=400),
    "sentencepiece-like": sentencepiece_like,
}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]()


class CountingTokenizer:
    """A tokenizer that records how many tokens each decode is given."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.sizes: list[int] = []

    def decode(self, ids) -> str:
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids)


def stream(tokenizer, ids: list[int], stop=(), include_stop=False) -> tuple[list[str], str | None]:
    """Feed the tokens one at a time as the engine does; the released pieces and the stop."""
    det = Detokenizer(tokenizer, stop, include_stop)
    pieces = []
    for i in range(1, len(ids) + 1):
        text, hit = det.add(ids[:i])
        pieces.append(text)
        if hit is not None:
            return pieces, hit
    pieces.append(det.flush())
    return pieces, None


def test_released_pieces_make_the_whole_decode(tokenizer):
    for text in TEXTS[:3]:
        ids = tokenizer.encode(text)
        pieces, hit = stream(tokenizer, ids)
        assert hit is None
        assert "".join(pieces) == tokenizer.decode(ids) == text
        assert not any("\ufffd" in p for p in pieces)  # no half character is ever released


def test_random_tokens_release_the_whole_decode(tokenizer):
    """Any token sequence, bytes that make no character included: the same text as one
    decode of all of it."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = rng.integers(3, tokenizer.vocab_size, 60).tolist()
        pieces, _ = stream(tokenizer, ids)
        assert "".join(pieces) == tokenizer.decode(ids)


def test_each_step_decodes_a_window_not_the_whole_output(tokenizer):
    ids = tokenizer.encode(" ".join(TEXTS))
    assert len(ids) > 100
    counting = CountingTokenizer(tokenizer)
    pieces, _ = stream(counting, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    # A window spans the last settled token(s) and the new one; a character cut into several
    # byte tokens widens it by those bytes only (4 at most in UTF-8).
    assert max(counting.sizes) <= 8


@pytest.mark.parametrize("include_stop", [False, True])
def test_stop_strings_cut_the_text_where_they_start(tokenizer, include_stop):
    text = TEXTS[1]
    ids = tokenizer.encode(text)
    for stop in ("café", "日本", "🚀", "wörld:"):
        pieces, hit = stream(tokenizer, ids, stop=[stop, "never there"], include_stop=include_stop)
        end = text.index(stop) + (len(stop) if include_stop else 0)
        assert hit == stop
        assert "".join(pieces) == text[:end]
