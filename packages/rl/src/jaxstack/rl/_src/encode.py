"""Records to token arrays: chat rendering, prompt/completion masks, padded sequence batches.

Conversations are rendered by datalib's `ChatTemplate` (an HF tokenizer_config's template, or
`DEFAULT_CHAT_TEMPLATE`) and masked so that only assistant tokens are learned. A sequence batch
holds one prompt + completion per row, left-aligned and padded, in the project's batch
convention (`tokens`, `targets`, `segment_ids`, `positions`, `loss_mask`), where `loss_mask` is 1
exactly on the targets that are completion tokens (the end-of-sequence token included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstack.rl._src.errors import ConfigError
from jaxstack.rl._src.records import Messages, SftRecord

# A plain-text template for tokenizers without one of their own (the byte tokenizer).
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class Encoder:
    """Turns records into token ids with one tokenizer and one chat template."""

    def __init__(self, tokenizer: Any, template: Any):
        self.tokenizer = tokenizer
        self.template = template

    def _ids(self, text: str) -> np.ndarray:
        from jaxstack.datalib import tokenize_text

        return tokenize_text(self.tokenizer, text)

    def _head(self) -> np.ndarray:
        bos = self.tokenizer.bos_id
        return np.asarray([] if bos is None else [bos], np.int32)

    def prompt(self, prompt: str | Messages) -> np.ndarray:
        """Token ids a completion is generated after: bos, then the prompt text (a
        conversation is rendered with the generation prompt)."""
        if not isinstance(prompt, str):
            prompt = self.template.render(prompt, add_generation_prompt=True)
        return np.concatenate([self._head(), self._ids(prompt)])

    def completion(self, completion: str) -> np.ndarray:
        """The completion's ids followed by end-of-sequence, which the model learns to emit."""
        return np.concatenate([self._ids(completion), [self.tokenizer.eos_id]]).astype(np.int32)

    def sft_document(self, record: SftRecord, train_on: str = "assistant") -> dict[str, np.ndarray]:
        """{"tokens", "loss_mask"} for datalib's `lm_batches` (pre-tokenized documents)."""
        if record.messages is None:
            prompt, completion = self.prompt(record.prompt), self.completion(record.completion)
            learn_prompt = 1 if train_on == "all" else 0
            mask = [
                np.full(len(prompt), learn_prompt, np.int32),
                np.ones(len(completion), np.int32),
            ]
            return {
                "tokens": np.concatenate([prompt, completion]),
                "loss_mask": np.concatenate(mask),
            }
        encoded = self.template.encode(record.messages, self.tokenizer, train_on=train_on)
        tail = [self.tokenizer.eos_id] if record.messages[-1]["role"] == "assistant" else []
        head = self._head()
        tokens = np.concatenate([head, encoded["tokens"], tail]).astype(np.int32)
        mask = np.concatenate(
            [np.zeros(len(head), np.int32), encoded["loss_mask"], np.ones(len(tail), np.int32)]
        )
        return {"tokens": tokens, "loss_mask": mask}


def sequence_batch(
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    seq_len: int,
    pad_id: int,
) -> dict[str, np.ndarray]:
    """One row per (prompt, completion), padded to `seq_len`; the completion is cut to fit.

    Raises ConfigError when a prompt leaves no room for a single completion token.
    """
    rows = len(prompts)
    tokens = np.full((rows, seq_len + 1), pad_id, np.int32)
    learn = np.zeros((rows, seq_len + 1), np.float32)
    lengths = np.zeros(rows, np.int32)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if len(p) >= seq_len:
            raise ConfigError(
                f"a prompt of {len(p)} tokens leaves no room for its completion in "
                f"data.seq_len={seq_len}; raise data.seq_len or shorten the prompts"
            )
        c = c[: seq_len + 1 - len(p)]
        n = len(p) + len(c)
        tokens[i, : len(p)] = p
        tokens[i, len(p) : n] = c
        learn[i, len(p) : n] = 1.0
        lengths[i] = n - 1  # positions that predict a next token
    real = np.arange(seq_len)[None, :] < lengths[:, None]
    return {
        "tokens": np.where(real, tokens[:, :-1], pad_id).astype(np.int32),
        "targets": np.where(real, tokens[:, 1:], pad_id).astype(np.int32),
        "segment_ids": real.astype(np.int32),
        "positions": np.where(real, np.arange(seq_len)[None, :], 0).astype(np.int32),
        "loss_mask": (learn[:, 1:] * real).astype(np.float32),
    }


def build_chat_template(path: str | None) -> Any:
    """datalib `ChatTemplate` from a tokenizer_config.json (file or folder), else the default."""
    from jaxstack import datalib

    if path is None:
        return datalib.ChatTemplate(DEFAULT_CHAT_TEMPLATE)
    return datalib.ChatTemplate.from_tokenizer_config(path)
