import json
import logging

import pytest

import jaxstack.datalib as dl


def test_text_source_by_file_and_by_line(tmp_path):
    (tmp_path / "a.txt").write_text("first\n\nsecond line\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("third\r\n   \nfourth", encoding="utf-8")
    by_file = dl.TextSource(str(tmp_path / "*.txt"))
    assert len(by_file) == 2 and by_file[1] == "third\r\n   \nfourth"
    by_line = dl.TextSource(str(tmp_path / "*.txt"), unit="line")
    assert [by_line[i] for i in range(len(by_line))] == ["first", "second line", "third", "fourth"]


def test_jsonl_field_selection(jsonl_file):
    src = dl.JsonlSource(jsonl_file)
    assert len(src) == 20 and src[2] == "document number 2 " * 3
    assert dl.JsonlSource(jsonl_file, field=["id"])[5] == {"id": 5}
    assert dl.JsonlSource(jsonl_file, field=None)[1]["id"] == 1


def _bad_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = ['{"text": "ok 1"}', "", '{"text": broken', '{"title": "no text"}', '{"text": "ok 2"}']
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_records_fail_with_file_and_line(tmp_path):
    path = _bad_jsonl(tmp_path)
    src = dl.JsonlSource(path)
    with pytest.raises(dl.SourceError, match=r"bad\.jsonl:3: bad JSON") as e:
        src[1]
    assert (e.value.path, e.value.line) == (str(path), 3)
    with pytest.raises(dl.SourceError, match=r"bad\.jsonl:4: missing field 'text'"):
        src[2]


def test_bad_records_are_skipped_and_counted_by_switch(tmp_path, caplog):
    src = dl.JsonlSource(_bad_jsonl(tmp_path), on_error="skip")
    with caplog.at_level(logging.WARNING, logger="jaxstack.datalib"):
        docs = [src[i] for i in range(len(src))]
    assert docs == ["ok 1", None, None, "ok 2"] and src.skipped == 2
    assert "bad.jsonl:3" in caplog.text
    # The pipeline drops the skipped records.
    batch = next(dl.lm_batches(src, seq_len=16, batch_size=2, packing="pad", shuffle=False))
    text = dl.ByteTokenizer().decode(batch["tokens"].ravel())
    assert "ok 1" in text and "ok 2" in text


def test_unreadable_and_undecodable_files(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe bad utf8")
    src = dl.TextSource([tmp_path / "bin.txt", tmp_path / "gone.txt"])
    with pytest.raises(dl.SourceError, match=r"bin\.txt: not UTF-8"):
        src[0]
    with pytest.raises(dl.SourceError, match=r"gone\.txt: unreadable file"):
        src[1]
    lenient = dl.TextSource([tmp_path / "bin.txt", tmp_path / "gone.txt"], on_error="skip")
    assert [lenient[0], lenient[1]] == [None, None] and lenient.skipped == 2


def test_empty_sources_are_errors(tmp_path):
    with pytest.raises(dl.EmptySourceError, match="matches no files"):
        dl.TextSource(str(tmp_path / "*.txt"))
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    with pytest.raises(dl.EmptySourceError, match="holds no documents"):
        dl.JsonlSource(tmp_path / "blank.jsonl")
    with pytest.raises(dl.EmptySourceError):
        dl.InMemorySource([])
    with pytest.raises(dl.EmptySourceError):
        dl.lm_batches([], seq_len=8, batch_size=1)


def test_an_empty_data_file_is_an_error_naming_it(tmp_path):
    empty = tmp_path / "train.txt"
    empty.write_text("")
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n\t\n")
    for unit in ("file", "line"):
        with pytest.raises(dl.EmptySourceError, match=str(empty)):
            dl.TextSource(str(empty), unit=unit)
    with pytest.raises(dl.EmptySourceError, match=r"blank\.txt.*train\.txt"):
        dl.TextSource(str(tmp_path / "*.txt"))
    (tmp_path / "docs.txt").write_text("one document")
    assert len(dl.TextSource(str(tmp_path / "*.txt"))) == 3  # one good file is enough


def test_array_record_round_trip(tmp_path):
    path = tmp_path / "docs.array_record"
    docs = [f"record {i}" for i in range(10)]
    assert dl.write_array_record(path, docs) == 10
    src = dl.ArrayRecordSource(path)
    assert len(src) == 10 and src[7] == "record 7"
    json_path = tmp_path / "j.array_record"
    dl.write_array_record(json_path, [json.dumps({"text": d}) for d in docs] + ["{oops"])
    src = dl.ArrayRecordSource(json_path, field="text", on_error="skip")
    assert src[3] == "record 3" and src[10] is None and src.skipped == 1


def test_parquet_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "bb", "ccc"], "n": [1, 2, 3]}), tmp_path / "t.parquet")
    src = dl.ParquetSource(tmp_path / "t.parquet")
    assert len(src) == 3 and src[2] == "ccc"
    with pytest.raises(dl.SourceError, match="no column 'body'"):
        dl.ParquetSource(tmp_path / "t.parquet", column="body")


def test_user_source_protocol_is_len_and_getitem():
    class Squares:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return "square " + str(i * i)

    batch = next(dl.lm_batches(Squares(), seq_len=32, batch_size=2, shuffle=False))
    assert "square 25" in dl.ByteTokenizer().decode(batch["tokens"].ravel())
    with pytest.raises(dl.ConfigError, match="not random-access"):
        dl.lm_batches(iter(["a"]), seq_len=8, batch_size=1)


def test_mixture_follows_weights():
    a = dl.InMemorySource(["a"] * 10)
    b = dl.InMemorySource(["b"] * 1000)
    mix = dl.mixture([a, b], [0.75, 0.25], length=400)
    docs = [mix[i] for i in range(len(mix))]
    assert len(docs) == 400 and docs.count("a") == 300  # the small source is upsampled
