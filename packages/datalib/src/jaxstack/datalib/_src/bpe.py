"""BPE tokenizers through the HF `tokenizers` library: train, save, and load any tokenizer.json.

A `BPETokenizer` is a thin adapter from `tokenizers.Tokenizer` to datalib's `Tokenizer` protocol;
the heavy lifting (training, the Rust encoder) is the library's. What is added: finding the
special-token ids of arbitrary HF files (from `tokenizer_config.json` beside the file, or by the
usual names), atomic saves, and a trainer that reads any datalib source.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from jaxstack.datalib._src import atomic
from jaxstack.datalib._src.errors import ConfigError, TokenizerError

# Names HF vocabularies use for their special tokens, most specific first.
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]", "<|startoftext|>")
_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|im_end|>", "[SEP]")
_PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")

DEFAULT_SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


def _token_content(value) -> str | None:
    """A tokenizer_config token entry is either a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class BPETokenizer:
    """A `tokenizers.Tokenizer` seen through datalib's `Tokenizer` protocol.

    Build one with `BPETokenizer.train(texts, vocab_size=...)` or `BPETokenizer.from_file(path)`
    (any HF `tokenizer.json`, BPE or not); `save(path)` writes `tokenizer.json` atomically.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
    ):
        self._tok = tokenizer
        self._bos_id = self._find(bos_token, _BOS_NAMES, "bos", required=False)
        eos = self._find(eos_token, _EOS_NAMES, "eos", required=True)
        assert eos is not None
        self._eos_id = eos
        pad = self._find(pad_token, _PAD_NAMES, "pad", required=False)
        # Padding positions carry loss_mask 0, so reusing eos as pad is harmless.
        self._pad_id = self._eos_id if pad is None else pad

    def _find(self, explicit: str | None, names: Sequence[str], role: str, *, required: bool):
        if explicit is not None:
            token_id = self._tok.token_to_id(explicit)
            if token_id is None:
                raise TokenizerError(
                    f"{role} token {explicit!r} is not in the vocabulary; pass one of its "
                    f"special tokens as {role}_token="
                )
            return token_id
        for name in names:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return token_id
        if required:
            raise TokenizerError(
                f"no {role} token found (looked for {', '.join(names)}); pass {role}_token= "
                "naming the vocabulary's end-of-document token"
            )
        return None

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int,
        min_frequency: int = 2,
        special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
        show_progress: bool = False,
    ) -> BPETokenizer:
        """Train a byte-level BPE (GPT-2 style: every byte is in the alphabet, no unknowns).

        Args:
          texts: any iterable of documents, e.g. `default_corpus("train")`.
          vocab_size: total size including the 256 byte tokens and `special_tokens`.
          min_frequency: merges seen fewer times are not learned.
          special_tokens: pad, bos and eos, in that order (ids 0, 1, 2).
        """
        if len(special_tokens) != 3:
            raise ConfigError(
                f"special_tokens must be (pad, bos, eos), got {tuple(special_tokens)!r}"
            )
        if vocab_size < 256 + len(special_tokens):
            raise ConfigError(f"vocab_size={vocab_size} is below the 259 byte+special tokens")
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(special_tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=show_progress,
        )
        tok.train_from_iterator((t for t in texts if t), trainer=trainer)
        pad, bos, eos = special_tokens
        return cls(tok, bos_token=bos, eos_token=eos, pad_token=pad)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
    ) -> BPETokenizer:
        """Load a `tokenizer.json` (or a folder holding one), e.g. a Hugging Face model's.

        Special tokens not passed explicitly come from `tokenizer_config.json` in the same
        folder when it exists, else from the common names (`</s>`, `<|endoftext|>`, ...).
        """
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{path}: no such tokenizer file; pass a tokenizer.json path")
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({e})") from None
        config_path = path.with_name("tokenizer_config.json")
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as e:
                raise TokenizerError(f"{config_path}: unreadable ({e})") from None
            bos_token = bos_token or _token_content(config.get("bos_token"))
            eos_token = eos_token or _token_content(config.get("eos_token"))
            pad_token = pad_token or _token_content(config.get("pad_token"))
        return cls(tok, bos_token=bos_token, eos_token=eos_token, pad_token=pad_token)

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write `tokenizer.json` atomically (a folder path gets `tokenizer.json` inside)."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        atomic.write_text(path, self._tok.to_str())
        return path

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def pad_id(self) -> int:
        return self._pad_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Several documents at once (the Rust encoder runs them in parallel)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"
