"""Text to token ids the way Hugging Face `AutoTokenizer(...)(text)` makes them.

A tokenizer.json's post-processor adds the model's special tokens (BOS for Llama, nothing for
Qwen or GPT-2); transformers applies it by default, and so do vLLM and this engine, so a
string prompt is the same token sequence here as in the model's own library. datalib's
tokenizers encode plain text (training data carries its own document markers), so the
post-processor is reached through the `tokenizers` backend when there is one. Rendered chat
templates already hold their special tokens: they are encoded with add_special_tokens=False,
as `apply_chat_template` does.
"""

from __future__ import annotations

from typing import Any


def encode_text(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """`text`'s token ids, with the special tokens the tokenizer's post-processor adds when
    `add_special_tokens` (tokenizers without a post-processor add none)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=add_special_tokens).ids
    return list(tokenizer.encode(text))
