"""jaxstack-serve's engine options as a vLLM user writes them (no model is loaded)."""

from __future__ import annotations

import pytest

from jaxstack.serving._src.llm.cli import _parser, kv_cache_bytes


def parse(*argv: str):
    return _parser().parse_args(["--model", "m", *argv])


def test_the_kv_cache_is_sized_in_gib_by_default_or_in_bytes():
    assert kv_cache_bytes(parse()) == 4 * 2**30
    assert kv_cache_bytes(parse("--kv-cache-gib", "0.5")) == 2**29
    assert kv_cache_bytes(parse("--kv-cache-memory-bytes", "1000000")) == 1000000
    assert parse("--num-blocks", "64").num_blocks == 64


def test_gib_and_bytes_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse("--kv-cache-gib", "1", "--kv-cache-memory-bytes", "5")
    assert "not allowed with argument" in capsys.readouterr().err


def test_lora_modules_are_name_path_pairs(capsys):
    args = parse("--lora-modules", "sql=runs/sql/adapter", "chat=/x/y=z")
    assert args.lora_modules == [("sql", "runs/sql/adapter"), ("chat", "/x/y=z")]
    with pytest.raises(SystemExit):
        parse("--lora-modules", "runs/sql/adapter")
    assert "'runs/sql/adapter' is not NAME=PATH" in capsys.readouterr().err
