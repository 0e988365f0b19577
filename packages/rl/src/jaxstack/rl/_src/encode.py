"""Records to token arrays: chat rendering, prompt/completion masks, padded sequence batches.

One rule for every stage: a completion is the tokens the model emits after its prompt, ending
in end-of-sequence. For a conversation the prompt is the chat template's rendering up to the
generation prompt and the completion is what the template adds for the assistant's reply (the
reply and its end-of-turn marker), then `eos`; SFT learns exactly these tokens, DPO and ORPO
score them, and GRPO and PPO prompt the engine with the same prompt tokens. Conversations are
rendered by datalib's `ChatTemplate` (the tokenizer folder's template, or
`DEFAULT_CHAT_TEMPLATE`). A sequence batch holds one prompt + completion per row, left-aligned
and padded, in the project's batch convention (`tokens`, `targets`, `segment_ids`, `positions`,
`loss_mask`), where `loss_mask` is 1 exactly on the targets that are completion tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstack.rl._src.errors import ConfigError
from jaxstack.rl._src.logprobs import completion_positions
from jaxstack.rl._src.records import Messages, SftRecord

DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""The chat template for tokenizers that have none (the byte tokenizer): each message as
`<|role|>`, a newline and its content, and `<|assistant|>` as the generation prompt."""


class Encoder:
    """Turns records into token ids with one tokenizer and one chat template."""

    def __init__(self, tokenizer: Any, template: Any):
        self.tokenizer = tokenizer
        self.template = template

    def _ids(self, text: str) -> np.ndarray:
        from jaxstack.datalib import tokenize_text

        return tokenize_text(self.tokenizer, text)

    def _with_bos(self, ids: np.ndarray) -> np.ndarray:
        """`bos` first, unless there is none or the text (a template's `bos_token`) has it."""
        bos = self.tokenizer.bos_id
        if bos is None or (len(ids) and ids[0] == bos):
            return np.asarray(ids, np.int32)
        return np.concatenate([[bos], ids]).astype(np.int32)

    def _with_eos(self, ids: np.ndarray) -> np.ndarray:
        eos = self.tokenizer.eos_id
        if len(ids) and ids[-1] == eos:
            return np.asarray(ids, np.int32)
        return np.concatenate([ids, [eos]]).astype(np.int32)

    def prompt_text(self, prompt: str | Messages) -> str:
        """The text a completion follows: the string, or the conversation rendered with the
        generation prompt."""
        if isinstance(prompt, str):
            return prompt
        return self.template.render(prompt, add_generation_prompt=True)

    def prompt(self, prompt: str | Messages) -> np.ndarray:
        """Token ids a completion is generated after: bos, then the prompt text."""
        return self._with_bos(self._ids(self.prompt_text(prompt)))

    def completion_text(self, prompt: str | Messages, completion: str | Messages) -> str:
        """The completion as text: the string, or what the template renders for the assistant
        messages after the conversational prompt (reply plus end-of-turn)."""
        if isinstance(prompt, str):
            if not isinstance(completion, str):
                raise ConfigError("a string prompt takes a string completion")
            return completion
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        head = self.template.render(prompt, add_generation_prompt=True)
        full = self.template.render([*prompt, *completion])
        if not full.startswith(head):
            raise ConfigError(
                "the chat template is not prefix-stable: the conversation with its reply does "
                "not start with the prompt rendered with the generation prompt, so the reply's "
                "tokens cannot be located; use a template that is (set sft.chat_template)"
            )
        return full[len(head) :]

    def completion(
        self, completion: str | Messages, prompt: str | Messages | None = None
    ) -> np.ndarray:
        """The completion's ids followed by end-of-sequence, which the model learns to emit;
        after a conversational `prompt`, the template's rendering of the reply."""
        text = self.completion_text("" if prompt is None else prompt, completion)
        return self._with_eos(self._ids(text))

    def sft_document(self, record: SftRecord, train_on: str = "assistant") -> dict[str, np.ndarray]:
        """{"tokens", "loss_mask"} for datalib's `lm_batches` (pre-tokenized documents)."""
        if record.text is not None:
            tokens = self._with_eos(self._with_bos(self._ids(record.text)))
            mask = np.ones(len(tokens), np.int32)
            mask[0] = 0 if tokens[0] == self.tokenizer.bos_id else 1
            return {"tokens": tokens, "loss_mask": mask}
        if record.messages is None:
            prompt = self.prompt(record.prompt)
            completion = self.completion(record.completion, record.prompt)
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
        tokens, mask = encoded["tokens"], encoded["loss_mask"]
        with_bos = self._with_bos(tokens)
        mask = np.concatenate([np.zeros(len(with_bos) - len(tokens), np.int32), mask])
        tokens = with_bos
        if record.messages[-1]["role"] == "assistant":
            with_eos = self._with_eos(tokens)
            mask = np.concatenate([mask, np.ones(len(with_eos) - len(tokens), np.int32)])
            tokens = with_eos
        return {"tokens": tokens.astype(np.int32), "loss_mask": mask.astype(np.int32)}


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


MIN_TRIMMED_LENGTH = 8
"""The shortest length `trim_padding` cuts a batch to."""


def trimmed_length(used: int) -> int:
    """The columns `trim_padding` keeps for a batch whose longest row uses `used`: the smallest
    power of two or three quarters of one (8, 12, 16, 24, 32, 48, ...) that holds it, so a run
    compiles its step for at most two lengths per doubling, and less than a third of the
    columns kept are padding (from 8 on)."""
    power = max(MIN_TRIMMED_LENGTH, 1 << max(0, used - 1).bit_length())
    three_quarters = 3 * power // 4
    fits = used <= three_quarters and three_quarters >= MIN_TRIMMED_LENGTH
    return three_quarters if fits else power


def trim_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with the padding columns that no row uses cut off, as TRL's collators pad to
    the longest row: rows of 9 tokens in a `data.seq_len=64` batch cost a 12-column step, not
    a 64-column one. Every `[rows, T]` array of the batch keeps its first `trimmed_length`
    columns (or T, if fewer) for the longest row of any of its `*segment_ids` arrays (DPO's
    chosen and rejected rows stay the same length); the columns cut are padding in every row,
    so losses and gradients do not change. Arrays of another shape (reference log-probs,
    params) pass through."""
    segment_keys = [k for k in batch if k.endswith("segment_ids")]
    if not segment_keys:
        return batch
    segments = np.stack([np.asarray(batch[k]) for k in segment_keys])
    width = segments.shape[-1]
    columns_in_use = np.flatnonzero(segments.any(axis=(0, 1)))
    used = int(columns_in_use[-1]) + 1 if columns_in_use.size else 1
    length = min(trimmed_length(used), width)
    if length == width:
        return batch

    def cut(x: Any) -> Any:
        is_row_array = isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[1] == width
        return x[:, :length] if is_row_array else x

    return {k: cut(v) for k, v in batch.items()}


MIN_PACKED_WIDTH = 64
"""The narrowest packed row `pack_rows` makes. A recipe GRPO update (2,048 rows of 9-12 tokens,
the arithmetic recipe's model) took 2.56 s in 16-column rows and 1.37 / 1.32 / 1.27 s packed
into rows of 32 / 48 / 64 (benchmarks/rl/README.md, "GRPO's rows packed")."""


def pack_rows(batch: dict[str, np.ndarray], rows_multiple: int = 1) -> dict[str, np.ndarray]:
    """A sequence batch as `completion_logprobs` reads it packed: the rows several to a row.

    Each row of the batch (its first `segment_ids.sum()` positions) goes whole into the first
    packed row with room, as its own segment with positions from 0, so attention and the model's
    outputs at its positions are those of the unpacked row. Returns the batch's `targets` and
    `loss_mask`, its `completion_index` (`completion_positions`), `packed_tokens`,
    `packed_positions` and `packed_segment_ids` `[P, W]` (W: the batch's width, at least
    `MIN_PACKED_WIDTH`) and `completion_source`: the flat packed position (`row * W + column`)
    of each `completion_index` entry; P is rounded by `packed_row_count`. Grain's first-fit
    packer does the same for a dataset, but took 1.4 s for 2,048 rows: longer than the update
    it shortens. GRPO's groups pack tighter with `pack_groups` (each prompt once).
    """
    rows, columns = batch["segment_ids"].shape
    lengths = np.count_nonzero(batch["segment_ids"], axis=1)
    width = max(MIN_PACKED_WIDTH, columns)
    room, members = np.full(rows + 1, width), np.zeros(rows + 1, np.int64)
    packed_row, offset, segment = (np.zeros(rows, np.int64) for _ in range(3))
    used = 0
    for i, n in enumerate(lengths):
        j = int(np.argmax(room[: used + 1] >= n))  # the first row with room; row `used` is new
        packed_row[i], offset[i] = j, width - room[j]
        members[j] += 1
        segment[i] = members[j]
        room[j] -= n
        used = max(used, j + 1)
    count = packed_row_count(used, rows_multiple)
    column = np.arange(columns)
    real = column[None, :] < lengths[:, None]
    where = ((packed_row * width + offset)[:, None] + column[None, :])[real]
    packed = {key: batch[key] for key in ("targets", "loss_mask")}
    for key, values in (
        ("tokens", batch["tokens"][real]),
        ("positions", batch["positions"][real]),
        ("segment_ids", np.broadcast_to(segment[:, None], real.shape)[real]),
    ):
        packed["packed_" + key] = np.zeros(count * width, np.int32)
        packed["packed_" + key][where] = values
        packed["packed_" + key] = packed["packed_" + key].reshape(count, width)
    source = np.zeros(real.shape, np.int64)
    source[real] = where
    return with_completion_source(packed, batch["loss_mask"], source)


def packed_row_count(used: int, rows_multiple: int) -> int:
    """`used` packed rows rounded up to a multiple of `rows_multiple` (the devices the rows are
    split over) and of a power of two >= used / 16: a run compiles for a few row counts and
    pads at most about a sixteenth."""
    step = math.lcm(1 << max(0, math.ceil(math.log2(max(used, 1) / 16))), rows_multiple)
    return -(-used // step) * step


def with_completion_source(
    packed: dict[str, np.ndarray], loss_mask: np.ndarray, where: np.ndarray
) -> dict[str, np.ndarray]:
    """`packed` with the rows' `completion_index` and its `completion_source`, read from
    `where`: the flat packed position of each row position `[B, T]`."""
    index = completion_positions(loss_mask)
    source = where.reshape(-1).astype(np.int32)
    packed["completion_index"] = index
    packed["completion_source"] = source[np.minimum(index, source.size - 1)]  # padding: any
    return packed


def build_chat_template(path: str | None) -> Any:
    """datalib `ChatTemplate` from a tokenizer_config.json (file or folder), else the default."""
    from jaxstack import datalib

    if path is None:
        return datalib.ChatTemplate(DEFAULT_CHAT_TEMPLATE)
    return datalib.ChatTemplate.from_tokenizer_config(path)


def shuffled_batches(num_records: int, batch_size: int, seed: int) -> Any:
    """Record indices in batches, a new order each epoch: a pure function of the step
    (`order[step]`), so a resumed run reads on where it stopped. datalib's shuffle, not Grain's
    `MapDataset.shuffle`, whose per-index cost grows as the record set shrinks (on a few hundred
    records it took a quarter of a DPO step)."""
    import grain

    from jaxstack import datalib

    indices = grain.MapDataset.range(num_records)
    return datalib.ShuffleShardMapDataset(indices, seed=seed).batch(batch_size)
