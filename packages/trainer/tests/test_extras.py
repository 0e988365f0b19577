"""Optional integrations: kernlib attention and xprof-lite step profiling, and the clear error
when the kernels extra is not installed."""

import json
import types

import numpy as np
import pytest

from jaxstack import kernlib
from jaxstack.trainer import ConfigError, load_config, read_jsonl, train
from jaxstack.trainer._src import extras

SHORT_RUN = [
    "train.steps=4",
    "eval.every=0",
    "checkpoint.enabled=false",
    "log.report=false",
    "log.tensorboard=false",
    "log.sample_tokens=0",
]


def test_attention_choice_resolves_to_the_function_nnlib_receives():
    assert extras.attention_function("xla") is None
    assert extras.attention_function("kernlib") is kernlib.attention
    with pytest.raises(ConfigError, match=r"train\.attention='flash' is not one of xla, kernlib"):
        extras.attention_function("flash")


def test_missing_extra_names_the_pip_command(monkeypatch):
    def not_installed(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(extras, "importlib", types.SimpleNamespace(import_module=not_installed))
    with pytest.raises(ConfigError, match=r"pip install 'jaxstack-trainer\[kernels\]'"):
        extras.attention_function("kernlib")
    with pytest.raises(ConfigError, match=r"pip install 'jaxstack-trainer\[kernels\]'"):
        extras.check(load_config("test", ["train.attention=kernlib"]))


def test_kernlib_attention_trains_like_the_default_and_profiling_captures_steps(tmp_path):
    default = train(load_config("test", [*SHORT_RUN, f"log.run_dir={tmp_path / 'xla'}"]))
    with_extras = train(
        load_config(
            "test",
            [
                *SHORT_RUN,
                f"log.run_dir={tmp_path / 'kernlib'}",
                "train.attention=kernlib",
                "log.profile_start=2",
                "log.profile_steps=2",
            ],
        )
    )

    def losses(result):
        return [
            r["loss"] for r in read_jsonl(result.run_dir / "metrics.jsonl") if r["kind"] == "train"
        ]

    np.testing.assert_allclose(losses(with_extras), losses(default), rtol=1e-5)
    traces = list((with_extras.run_dir / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1
    # What `jaxstack-prof report` needs besides the trace: the step's HLO and memory, and the
    # very peak the run measured MFU against (f32 for the f32 test model).
    saved = with_extras.run_dir / "profile" / "xprof_lite_hlo"
    assert list(saved.glob("*.hlo.txt")) and list(saved.glob("*.memory.json"))
    peak = json.loads((saved / "peak.json").read_text())
    assert peak["flops_per_s_f32"] == with_extras.summary["peak_flops_per_device"]
