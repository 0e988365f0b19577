"""GRPO's groups packed with their prompt once: the model reads a group's prompt one time.

A GRPO batch holds each prompt `group_size` times, once per sampled completion, and the prompt
is most of every row (the arithmetic recipe: 7 prompt tokens, 1-6 completion tokens). The
prompt's hidden states do not depend on the completion after it (attention is causal), so
`pack_groups` writes each group's prompt once in a packed row and its completions after it,
and `shared_prompt_attention` lets each completion attend to its own tokens and to its group's
prompt, not to the other completions. Log-probs, the loss and its gradients are those of the
unpacked rows (the prompt's gradient is the sum of what each row's copy would get); the model
runs over about a third of the tokens in the recipe (verl's "prefix grouper" does the same
for the same reason).

A packed row's segment ids say which group ("family") and which member of it a token is:
`family * FAMILY_STRIDE + member`, families numbered from 1 in each row, member 0 the prompt and
1, 2, ... the completions; 0 is padding.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.rl._src.encode import MIN_PACKED_WIDTH, packed_row_count, with_completion_source

FAMILY_STRIDE = 1 << 16
"""Segment ids of a packed row: `family * FAMILY_STRIDE + member` (member 0: the prompt)."""


def pack_groups(
    batch: dict[str, np.ndarray],
    prompt_lengths: np.ndarray,
    group_size: int,
    rows_multiple: int = 1,
) -> dict[str, np.ndarray]:
    """A GRPO sequence batch (rows `g * group_size ...` hold prompt g, `prompt_lengths[g]`
    tokens, then one completion each) packed for `completion_logprobs` with each group's
    prompt written once and its completions after it, in the first packed row with room (a
    group that does not fit in the room left starts over with another copy of its prompt).

    Returns what `pack_rows` returns (`targets`, `loss_mask`, `completion_index`, the
    `packed_*` arrays `[P, W]` and `completion_source`), with `packed_segment_ids` numbered for
    `shared_prompt_attention`. Raises ValueError when a group's rows do not share their prompt.
    """
    rows, columns = batch["segment_ids"].shape
    prompt_lengths = np.asarray(prompt_lengths, np.int64)
    if rows != len(prompt_lengths) * group_size or group_size >= FAMILY_STRIDE:
        raise ValueError(
            f"pack_groups: {rows} rows are not {len(prompt_lengths)} prompts x {group_size} "
            f"completions (group_size < {FAMILY_STRIDE})"
        )
    lengths = np.count_nonzero(batch["segment_ids"], axis=1)
    groups = lengths.reshape(-1, group_size)
    prompt_lengths = np.minimum(prompt_lengths, groups.max(axis=1))  # a prompt cut at seq_len
    prompt = np.repeat(prompt_lengths, group_size)
    donor = np.arange(0, rows, group_size) + groups.argmax(axis=1)  # a row with the whole prompt
    column = np.arange(columns)[None, :]
    in_prompt = column < np.minimum(prompt, lengths)[:, None]
    if np.any((batch["tokens"] != np.repeat(batch["tokens"][donor], group_size, 0)) & in_prompt):
        raise ValueError("pack_groups: the rows of a group do not start with the same prompt")
    tails = np.maximum(lengths - prompt, 0)  # each completion's own input tokens
    width = max(MIN_PACKED_WIDTH, columns)
    room, families = [], []  # per packed row: free columns, families placed
    pieces = []  # (packed flat start, source flat start, length, segment id)
    prompt_at, tail_at = np.zeros(rows, np.int64), np.zeros(rows, np.int64)

    def place(need: int) -> int:
        packed_row = next((j for j, free in enumerate(room) if free >= need), len(room))
        if packed_row == len(room):
            room.append(width)
            families.append(0)
        return packed_row

    for g, n in enumerate(prompt_lengths):
        members = range(g * group_size, (g + 1) * group_size)
        packed_row, start = -1, 0
        for member, row in enumerate(members, 1):
            if packed_row < 0 or room[packed_row] < tails[row]:  # a new copy of the prompt
                packed_row = place(n + tails[row])
                families[packed_row] += 1
                family = families[packed_row] * FAMILY_STRIDE
                start = packed_row * width + width - room[packed_row]
                pieces.append((start, donor[g] * columns, n, family))
                room[packed_row] -= n
            prompt_at[row] = start
            tail_at[row] = packed_row * width + width - room[packed_row]
            pieces.append((tail_at[row], row * columns + n, tails[row], family + member))
            room[packed_row] -= tails[row]
    to, source, length, segment = (np.asarray(x, np.int64) for x in zip(*pieces, strict=True))
    offset = np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)
    to, source = np.repeat(to, length) + offset, np.repeat(source, length) + offset
    count = packed_row_count(len(room), rows_multiple)
    packed = {key: batch[key] for key in ("targets", "loss_mask")}
    for key, values in (
        ("tokens", batch["tokens"].reshape(-1)[source]),
        ("positions", batch["positions"].reshape(-1)[source]),
        ("segment_ids", np.repeat(segment, length)),
    ):
        packed["packed_" + key] = np.zeros(count * width, np.int32)
        packed["packed_" + key][to] = values
        packed["packed_" + key] = packed["packed_" + key].reshape(count, width)
    # where each row's position sits packed: in its prompt's copy, or in its own tail
    where = np.where(
        column < prompt[:, None],
        prompt_at[:, None] + column,
        tail_at[:, None] + column - prompt[:, None],
    )
    return with_completion_source(packed, batch["loss_mask"], where)


def shared_prompt_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    scale: float | None = None,
) -> jax.Array:
    """nnlib's attention contract over `pack_groups` rows: a token attends to the earlier tokens
    of its own member and of its family's prompt (member 0). Plain segment ids (below
    `FAMILY_STRIDE`) mask as nnlib's `dot_product_attention` does. Sliding windows are not
    supported (they need the tokens' positions): such models pack with `pack_rows`."""
    from jaxstack import nnlib

    if sliding_window is not None or not causal:
        raise ValueError("shared_prompt_attention is causal, without sliding windows")
    if segment_ids is None:
        segment_ids = jnp.ones(q.shape[:2], jnp.int32)
    family, member = segment_ids // FAMILY_STRIDE, segment_ids % FAMILY_STRIDE
    index = jnp.arange(q.shape[1])
    mask = (
        (family[:, :, None] == family[:, None, :])
        & ((member[:, None, :] == 0) | (member[:, :, None] == member[:, None, :]))
        & (segment_ids[:, None, :] != 0)
        & (index[:, None] >= index[None, :])
    )
    return nnlib.masked_attention(q, k, v, mask, logits_soft_cap=logits_soft_cap, scale=scale)


def shares_prompts(model_config: Any) -> bool:
    """Whether a model can run `pack_groups` batches: no layer has a sliding window."""
    return all(window is None for window in model_config.layer_windows())
