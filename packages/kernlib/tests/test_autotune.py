"""`jaxstack-kern autotune` on CPU: the sweep runs, the winner is recorded and reused."""

import json
import subprocess
import sys

from jaxstack import kernlib
from jaxstack.kernlib._src import cli, device, tuning
from jaxstack.kernlib.ops.rms_norm import api as rms_api
from jaxstack.kernlib.ops.rms_norm import base as rms_base


def test_autotune_records_the_fastest_and_dispatch_reuses_it(user_cache, capsys):
    rc = cli.main(
        [
            "autotune",
            "--op",
            "rms_norm",
            "--dims",
            "rows=16,dim=32",
            "--interpret",
            "--implementations",
            "xla,pallas_triton",
            "--max-configs",
            "2",
            "--repeats",
            "2",
        ]
    )
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    entry = json.loads(lines[-1])
    assert entry["op"] == "rms_norm" and entry["candidates"] == 3
    timed = [ln for ln in lines if " ms" in ln]
    assert len(timed) == 3
    stored = json.loads(user_cache.read_text())["entries"][device.device_kind()]["rms_norm"]
    ((spec, saved),) = stored.items()
    args, options = rms_base.example({"rows": 16, "dim": 32}, "bfloat16")
    assert spec == rms_api.OP.spec(*args, **options)
    assert saved["implementation"] == entry["implementation"] and saved["interpret"] is True
    # an interpreter-measured winner never steers implementation=None...
    assert kernlib.which_implementation("rms_norm", *args, **options)[0] == "xla"
    # ...but its config is what an explicit request for that implementation gets
    if saved["implementation"] == "pallas_triton":
        _, cfg = kernlib.which_implementation(
            "rms_norm", *args, implementation="pallas_triton", interpret=True, **options
        )
        assert cfg == saved["config"]


def test_autotune_function_ties_go_to_the_earlier_candidate(user_cache):
    cache = tuning.TuningCache(user_path=user_cache)
    entry = kernlib.autotune(
        "grouped_matmul",
        {"m": 32, "k": 16, "n": 16, "groups": 2},
        dtype="float32",
        implementations=["xla"],
        repeats=1,
        warmup=1,
        cache=cache,
        log=lambda s: None,
    )
    assert entry["implementation"] == "xla" and entry["config"] is None
    assert entry["candidates"] == 1


def test_show_and_which_commands(user_cache):
    show = subprocess.run(
        [sys.executable, "-m", "jaxstack.kernlib._src.cli", "show"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(show.stdout)["user_cache"] == str(user_cache)
    rc = cli.main(["which", "--op", "attention", "--dims", "seq=16,heads=2,kv_heads=1,head_dim=8"])
    assert rc == 0


def test_bad_dims_are_a_clear_cli_error(capsys):
    assert cli.main(["which", "--op", "rms_norm", "--dims", "rows=x"]) == 2
    assert "name=integer" in capsys.readouterr().err
