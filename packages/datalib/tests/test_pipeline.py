import json
import multiprocessing
import sys

import grain
import numpy as np
import pytest

import jaxstack.datalib as dl


def numbered_docs(n: int, repeat: int = 5) -> list[str]:
    """Documents that say which they are, so tests can tell them apart after tokenization."""
    return [f"<{i:04d}>" + "x" * (repeat * (i % 7 + 1)) for i in range(n)]


KEYS = {"tokens", "targets", "segment_ids", "positions", "loss_mask"}


def take(it, n):
    return [next(it) for _ in range(n)]


def states_and_batches(it, n):
    """n steps of `it`: the state before each step (after a JSON round trip) and its batch."""
    states, batches = [], []
    for _ in range(n):
        states.append(json.loads(json.dumps(it.get_state())))
        batches.append(next(it))
    return states, batches


def assert_resumes_exactly(resumed, states, batches, points):
    """From each point's state, `resumed` gives the next five batches that were recorded."""
    for point in points:
        resumed.set_state(states[point])
        for want in batches[point : point + 5]:
            got = next(resumed)
            for key in KEYS:
                np.testing.assert_array_equal(want[key], got[key])


def check_conventions(batch, batch_size, seq_len):
    assert set(batch) == KEYS
    for key, value in batch.items():
        assert value.shape == (batch_size, seq_len), key
        assert value.dtype == (np.float32 if key == "loss_mask" else np.int32), key
    seg, pos, tok, tgt, mask = (
        batch[k] for k in ("segment_ids", "positions", "tokens", "targets", "loss_mask")
    )
    real = seg > 0
    # loss only on real positions; padding has segment 0, position 0
    assert np.all(mask[~real] == 0) and np.all(pos[~real] == 0)
    for row in range(batch_size):
        ids = np.unique(seg[row][real[row]])
        assert list(ids) == list(range(1, len(ids) + 1))  # numbered from 1
        for s in ids:
            where = np.flatnonzero(seg[row] == s)
            assert np.array_equal(where, np.arange(where[0], where[-1] + 1))  # contiguous
            assert np.array_equal(pos[row, where], np.arange(len(where)))
            # next-token shift inside the segment, never across its boundary
            assert np.array_equal(tgt[row, where[:-1]], tok[row, where[1:]])


@pytest.mark.parametrize("packing", dl.PACKING_METHODS)
def test_batches_follow_the_conventions(corpus, packing):
    it = dl.lm_batches(corpus, seq_len=128, batch_size=4, packing=packing, seed=3)
    for batch in take(it, 3):
        check_conventions(batch, 4, 128)
        assert batch["loss_mask"].sum() > 0


def test_documents_are_wrapped_in_bos_eos_and_every_token_is_a_target_once():
    docs = numbered_docs(12)
    tok = dl.ByteTokenizer()
    # batch_size=1: no partial final batch to drop
    it = dl.lm_batches(
        docs, tok, seq_len=64, batch_size=1, packing="first_fit", num_epochs=1, shuffle=False
    )
    targets, starts = [], 0
    for batch in it:
        real = batch["loss_mask"] > 0
        targets.extend(batch["targets"][real].tolist())
        starts += int(np.sum(batch["tokens"] == tok.bos_id))
    # all documents (ids + eos) appear as targets exactly once; bos is input only
    expected = sorted(t for d in docs for t in [*tok.encode(d), tok.eos_id])
    assert sorted(targets) == expected and starts == len(docs)


def test_long_documents_are_cut_without_losing_targets():
    tok = dl.ByteTokenizer()
    doc = "abcdefghij" * 30  # 300 bytes > seq_len
    it = dl.lm_batches(
        [doc], tok, seq_len=64, batch_size=1, packing="first_fit", num_epochs=1, shuffle=False
    )
    rows = list(it)
    learned = np.concatenate([r["targets"][r["loss_mask"] > 0] for r in rows])
    assert tok.decode(learned) == doc and learned[-1] == tok.eos_id


def test_first_fit_packs_the_default_corpus_at_least_95_percent(corpus):
    it = dl.lm_batches(corpus, seq_len=1024, batch_size=8, seed=0)
    assert dl.packing_efficiency(take(it, 64)) >= 0.95


def test_same_seed_same_batches_other_seed_other_batches(corpus):
    a = take(dl.lm_batches(corpus, seq_len=64, batch_size=2, seed=1), 3)
    b = take(dl.lm_batches(corpus, seq_len=64, batch_size=2, seed=1), 3)
    c = take(dl.lm_batches(corpus, seq_len=64, batch_size=2, seed=2), 3)
    assert all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(a, c, strict=True))


def _epoch_orders(num_epochs, **kw):
    docs = [f"<{i:03d}>" for i in range(30)]
    ds = dl.ShuffleShardMapDataset(grain.MapDataset.source(docs), num_epochs=num_epochs, **kw)
    return [ds[i] for i in range(len(ds))]


def test_global_shuffle_is_a_new_permutation_each_epoch():
    order = _epoch_orders(2, seed=7)
    first, second = order[:30], order[30:]
    assert sorted(first) == sorted(second) == sorted(set(first)) and first != second
    assert order == _epoch_orders(2, seed=7)


def test_the_shuffle_order_is_pinned():
    """Resuming a run relies on the same seed giving the same order on every NumPy version."""
    assert _epoch_orders(1, seed=0)[:8] == [f"<{i:03d}>" for i in (11, 3, 20, 13, 2, 21, 15, 1)]


def test_sources_beyond_the_table_limit_keep_grains_index_shuffle(monkeypatch):
    from jaxstack.datalib._src import shuffle

    monkeypatch.setattr(shuffle, "TABLE_LIMIT", 16)
    expected = [
        grain.experimental.index_shuffle(i, max_index=29, seed=7, rounds=4) for i in range(30)
    ]
    assert _epoch_orders(1, seed=7) == [f"<{i:03d}>" for i in expected]


def test_a_state_of_datalib_0_3_restores_its_position_with_a_warning():
    docs = numbered_docs(40)
    it = dl.lm_batches(docs, seq_len=32, batch_size=2, seed=3)
    take(it, 3)
    state = {**it.get_state(), "version": 1}
    want = next(it)
    resumed = dl.lm_batches(docs, seq_len=32, batch_size=2, seed=3)
    with pytest.warns(UserWarning, match="0.3 or older"):
        resumed.set_state(state)
    np.testing.assert_array_equal(next(resumed)["tokens"], want["tokens"])
    with pytest.raises(dl.StateError, match="state version 0"):
        resumed.set_state({**state, "version": 0})


def test_shards_are_disjoint_and_cover_each_epoch():
    shards = [_epoch_orders(1, seed=5, shard_index=i, shard_count=4) for i in range(4)]
    seen = [d for s in shards for d in s]
    assert all(len(s) == 7 for s in shards)  # 30 // 4: equal work per process
    assert len(set(seen)) == 28  # disjoint; 2 of 30 left out this epoch
    with pytest.raises(dl.ConfigError, match="shard_index"):
        dl.lm_batches(numbered_docs(8), seq_len=8, batch_size=1, shard_index=2, shard_count=2)


@pytest.mark.parametrize("packing", dl.PACKING_METHODS)
def test_json_state_restores_exactly_mid_epoch(corpus, packing):
    kw = dict(seq_len=128, batch_size=4, packing=packing, seed=11)
    states, batches = states_and_batches(dl.lm_batches(corpus, **kw), 24)
    assert max(len(json.dumps(s)) for s in states) < 4096
    # inside and across documents and packing groups
    assert_resumes_exactly(dl.lm_batches(corpus, **kw), states, batches, (0, 3, 7, 12, 19))


def test_state_from_another_pipeline_is_refused(corpus):
    state = dl.lm_batches(corpus, seq_len=64, batch_size=2).get_state()
    other = dl.lm_batches(corpus, seq_len=128, batch_size=2)
    with pytest.raises(dl.StateError, match="seq_len"):
        other.set_state(state)
    with pytest.raises(dl.StateError, match="not an lm_batches state"):
        other.set_state({"next_index": 3})


def test_finite_epochs_end_and_closed_iterators_refuse():
    it = dl.lm_batches(numbered_docs(10), seq_len=32, batch_size=2, num_epochs=2)
    batches = list(it)
    assert batches and all(b["tokens"].shape == (2, 32) for b in batches)
    it.close()
    with pytest.raises(dl.StateError, match="closed"):
        next(it)


def test_workers_restore_exactly_do_not_import_jax_and_shut_down_cleanly(corpus):
    class JaxProbe:
        """Documents that report whether JAX is loaded in the process that reads them.

        Defined locally so that it travels to the workers by value, not by module name.
        """

        def __len__(self):
            return 16

        def __getitem__(self, i):
            return f"[jax={'jax' in sys.modules}]" * (1 + i % 3)

    kw = dict(seq_len=128, batch_size=2, num_workers=2, seed=4)
    with dl.lm_batches(corpus, **kw) as it:
        take(it, 5)
        state = json.loads(json.dumps(it.get_state()))
        expected = take(it, 4)
    assert not multiprocessing.active_children()
    with dl.lm_batches(corpus, **kw) as resumed:
        resumed.set_state(state)
        for want, got in zip(expected, take(resumed, 4), strict=True):
            np.testing.assert_array_equal(want["tokens"], got["tokens"])
            np.testing.assert_array_equal(want["segment_ids"], got["segment_ids"])
    with dl.lm_batches(JaxProbe(), seq_len=32, batch_size=2, num_workers=2) as probe:
        text = dl.ByteTokenizer().decode(next(probe)["tokens"].ravel())
    assert "[jax=False]" in text and "[jax=True]" not in text
    assert not multiprocessing.active_children()


def test_mixture_source_through_lm_batches():
    mix = dl.mixture([["aaaa"] * 5, ["bbbb"] * 5], [0.5, 0.5], length=40)
    batches = list(dl.lm_batches(mix, seq_len=16, batch_size=2, num_epochs=1))
    text = dl.ByteTokenizer().decode(np.concatenate([b["tokens"].ravel() for b in batches]))
    assert abs(text.count("aaaa") - text.count("bbbb")) <= 4


def test_grain_transformations_compose_before_lm_batches(corpus):
    short = grain.MapDataset.source(corpus).filter(lambda d: len(d) < 2000).map(str.upper)
    batch = next(dl.lm_batches(short, seq_len=64, batch_size=2))
    text = dl.ByteTokenizer().decode(batch["tokens"].ravel())
    assert text == text.upper()


@pytest.mark.slow
@pytest.mark.parametrize("packing", dl.PACKING_METHODS)
def test_workers_restore_exactly_for_every_packing_method_at_several_points(corpus, packing):
    kw = dict(seq_len=256, batch_size=3, num_workers=2, seed=9, packing=packing)
    with dl.lm_batches(corpus, **kw) as it:
        states, batches = states_and_batches(it, 40)
    with dl.lm_batches(corpus, **kw) as resumed:
        assert_resumes_exactly(resumed, states, batches, (1, 17, 33))


def test_bad_arguments_are_config_errors(corpus):
    with pytest.raises(dl.ConfigError, match="packing"):
        dl.lm_batches(corpus, seq_len=8, batch_size=1, packing="best")
    with pytest.raises(dl.ConfigError, match="Tokenizer protocol"):
        dl.lm_batches(corpus, object(), seq_len=8, batch_size=1)
    with pytest.raises(dl.ConfigError, match="batch_size"):
        dl.lm_batches(corpus, seq_len=8, batch_size=0)


def test_an_iterator_left_open_exits_without_tracebacks_or_leaks(tmp_path):
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(
        "import jaxstack.datalib as dl\n"
        "if __name__ == '__main__':\n"
        "    it = dl.lm_batches(dl.default_corpus(), seq_len=64, batch_size=2, num_workers=1)\n"
        "    batch = next(it)\n"
        "    print('ok', batch['tokens'].shape)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip() == "ok (2, 64)"
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    assert "leaked" not in out.stderr, out.stderr


def test_state_encoding_keeps_tuples_and_non_string_keys():
    from jaxstack.datalib._src.iterator import from_json_safe, to_json_safe

    state = {"slices": {"lm": (0, 5)}, "workers": {3: [4, (5,)]}, "n": np.int64(7)}
    back = from_json_safe(json.loads(json.dumps(to_json_safe(state))))
    assert back == {"slices": {"lm": (0, 5)}, "workers": {3: [4, (5,)]}, "n": 7}
    assert isinstance(back["slices"]["lm"], tuple)
