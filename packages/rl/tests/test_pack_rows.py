"""GRPO's update packs its rollout rows: each row whole in one packed row, as its own segment."""

import numpy as np

from jaxstack import rl
from jaxstack.rl._src.encode import MIN_PACKED_WIDTH, sequence_batch


def batch_of(lengths, seq_len=16):
    """Row i: a prompt of 2 tokens and a completion, lengths[i] positions in all, every one of
    them in the loss mask (so `completion_source` locates them all); token values say which
    row they came from (100 * row + column)."""
    prompts = [np.array([100 * i, 100 * i + 1]) for i in range(len(lengths))]
    completions = [100 * i + np.arange(2, n + 1) for i, n in enumerate(lengths)]
    batch = sequence_batch(prompts, completions, seq_len, pad_id=0)
    batch["loss_mask"] = batch["segment_ids"].astype(np.float32)
    return batch


def test_each_row_lands_whole_in_a_segment_of_its_own():
    lengths = [12, 9, 15, 3, 10, 12, 8, 14, 2, 11]
    batch = batch_of(lengths)
    packed = rl.pack_rows(batch)
    tokens, positions = packed["packed_tokens"], packed["packed_positions"]
    segments = packed["packed_segment_ids"].reshape(-1)
    assert tokens.shape == (2, MIN_PACKED_WIDTH)  # 96 positions: two rows of 64
    np.testing.assert_array_equal(
        packed["completion_index"][:96], np.flatnonzero(batch["loss_mask"])
    )
    source = dict(
        zip(packed["completion_index"][:96], packed["completion_source"][:96], strict=True)
    )
    owners = {}
    for row, n in enumerate(lengths):
        where = np.array([source[row * 16 + column] for column in range(n)])
        packed_row, column = np.divmod(where, MIN_PACKED_WIDTH)
        assert (packed_row == packed_row[0]).all()  # one packed row
        np.testing.assert_array_equal(column, column[0] + np.arange(n))  # contiguous, in order
        np.testing.assert_array_equal(tokens.reshape(-1)[where], batch["tokens"][row, :n])
        np.testing.assert_array_equal(positions.reshape(-1)[where], np.arange(n))
        assert segments[where[0]] > 0 and (segments[where] == segments[where[0]]).all()
        owners.setdefault((packed_row[0], segments[where[0]]), []).append(row)
    assert all(len(rows) == 1 for rows in owners.values())  # no segment holds two rows
    assert (segments > 0).sum() == sum(lengths)  # the rest is padding, segment 0
    for key in ("targets", "loss_mask"):  # what the loss reads stays in the rows' layout
        np.testing.assert_array_equal(packed[key], batch[key])


def test_first_fit_fills_earlier_rows_before_opening_new_ones():
    # 40 + 40 do not share a row; 20 goes back to the first row's room
    packed = rl.pack_rows(batch_of([40, 40, 20], seq_len=64))
    np.testing.assert_array_equal((packed["packed_segment_ids"] > 0).sum(axis=1), [60, 40])


def test_the_row_count_is_rounded_for_the_devices_and_a_few_compiled_shapes():
    assert rl.pack_rows(batch_of([16] * 12))["packed_tokens"].shape == (3, 64)
    assert rl.pack_rows(batch_of([16] * 12), rows_multiple=2)["packed_tokens"].shape == (4, 64)
    # 132 rows of 64 needed: rounded up to a multiple of 16 (a power of two >= 132 / 16)
    assert rl.pack_rows(batch_of([16] * 528))["packed_tokens"].shape == (144, 64)


def test_rows_wider_than_the_minimum_pack_at_their_own_width():
    packed = rl.pack_rows(batch_of([100, 28], seq_len=128))
    assert packed["packed_tokens"].shape == (1, 128)
