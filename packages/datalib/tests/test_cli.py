import json
import subprocess
import sys

import pytest

from jaxstack.datalib._src.cli import main


def run(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_reports_packing_efficiency_of_the_default_corpus(capsys):
    out = run(capsys, "inspect", "--json", "--seq-len", "1024", "--batches", "8")
    assert out["packing_efficiency"] >= 0.95 and out["batches"] == 8


def test_inspect_prints_decoded_segments(capsys):
    assert main(["inspect", "--seq-len", "128", "--batches", "2", "--samples", "1"]) == 0
    text = capsys.readouterr().out
    assert "--- segment 1:" in text and "packing efficiency" in text


def test_stats_counts_documents_and_tokens(capsys, jsonl_file):
    out = run(capsys, "stats", "--json", "--source", str(jsonl_file))
    assert out["documents"] == 20
    expected = sum(len(f"document number {i} " * (i + 1)) for i in range(20))
    assert out["tokens"] == expected  # byte tokenizer: tokens = UTF-8 bytes
    assert sum(b["count"] for b in out["histogram"]) == 20


def test_bench_measures_throughput(capsys, jsonl_file):
    out = run(
        capsys,
        "bench",
        "--json",
        "--source",
        str(jsonl_file),
        "--seq-len",
        "64",
        "--batch-size",
        "2",
        "--batches",
        "5",
    )
    assert out["batches"] == 5 and out["tokens"] > 0 and out["tokens_per_sec"] > 0


def test_errors_exit_2_with_a_message(capsys, tmp_path):
    assert main(["stats", "--source", str(tmp_path / "*.jsonl")]) == 2
    assert "matches no files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["nope"])


def test_help_loads_neither_grain_nor_numpy():
    # Grain is an extra, and `--help` of every jaxstack CLI should answer in well under 1 s.
    code = (
        "import sys\n"
        "sys.modules['grain'] = None  # as if the grain extra were not installed\n"
        "from jaxstack.datalib._src.cli import main\n"
        "for argv in (['--help'], ['inspect', '--help'], ['bench', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "print(sorted(m for m in ('grain', 'numpy', 'jax') if sys.modules.get(m)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
    assert "first_fit" in done.stdout  # the --packing choices are listed
