import os
import time

import jaxstack.datalib as dl
from jaxstack.datalib._src import corpus as corpus_module


def test_default_corpus_is_big_enough_and_fast_to_open():
    start = time.perf_counter()
    train = dl.default_corpus("train")
    validation = dl.default_corpus("validation")
    opened = time.perf_counter() - start
    assert train.num_bytes() > 5_000_000  # a few MB of text for the main job
    assert validation.num_bytes() > 100_000 and len(validation) >= 10
    assert opened < 5.0  # generous: a directory listing, no cache to build
    assert "def " in train[0] or "import" in train[0]


def test_split_is_disjoint_and_fixed_by_path_hash():
    train = dl.default_corpus("train")
    validation = dl.default_corpus("validation")
    assert not set(train.relative_paths) & set(validation.relative_paths)
    assert all(corpus_module.split_of(p) == "validation" for p in validation.relative_paths)
    frac = len(validation) / (len(train) + len(validation))
    assert 0.02 < frac < 0.10  # VALIDATION_PERCENT = 5 by hash
    # The rule is a pure function of the path string.
    assert corpus_module.split_of("json/decoder.py") == corpus_module.split_of("json/decoder.py")


def test_listing_is_sorted_relative_and_excludes_tests():
    train = dl.default_corpus("train")
    assert train.relative_paths == sorted(train.relative_paths)
    assert not any(p.startswith(("test/", "idlelib/", "tkinter/")) for p in train.relative_paths)
    assert all(not os.path.isabs(p) and p.endswith(".py") for p in train.relative_paths)
    again = dl.default_corpus("train")
    assert again.fingerprint() == train.fingerprint()


def test_bad_split_name():
    try:
        dl.default_corpus("test")
    except dl.ConfigError as e:
        assert "validation" in str(e)
    else:
        raise AssertionError("expected ConfigError")
