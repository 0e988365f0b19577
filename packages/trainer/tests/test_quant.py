"""QAT in a training run (`quant.rules=...`, the `quant` extra) and its errors."""

import builtins

import numpy as np
import pytest

from jaxstack import quantlib
from jaxstack.trainer import ConfigError, load_config, read_jsonl, train
from jaxstack.trainer._src import quant

SHORT_RUN = [
    "train.steps=3",
    "eval.every=0",
    "checkpoint.enabled=false",
    "log.report=false",
    "log.tensorboard=false",
    "log.sample_tokens=0",
]


def losses(result):
    return [r["loss"] for r in read_jsonl(result.run_dir / "metrics.jsonl") if r["kind"] == "train"]


def test_qat_run_trains_the_fake_quantised_model(tmp_path):
    default = train(load_config("test", [*SHORT_RUN, f"log.run_dir={tmp_path / 'float'}"]))
    qat = train(
        load_config("test", [*SHORT_RUN, f"log.run_dir={tmp_path / 'qat'}", "quant.rules=int8"])
    )
    a, b = np.array(losses(default)), np.array(losses(qat))
    assert np.all(np.isfinite(b))
    assert not np.allclose(a, b, rtol=1e-6)  # the int8 rounding is in the forward pass
    np.testing.assert_allclose(a, b, rtol=0.05)  # yet it trains the same model


def test_the_session_model_is_intercepted_by_the_rules():
    config = load_config("test", ["quant.rules=w8a8"])
    model = quant.apply(config, _model(config))
    rules = {m.quant_rule for _, m in _modules(model) if hasattr(m, "quant_rule")}
    assert rules == set(quantlib.PRESETS["w8a8"])


def test_bad_rules_are_a_config_error_naming_the_field(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("- {module_path: '.*', weight_qtype: int3}\n")
    with pytest.raises(ConfigError, match=r"quant\.rules=.*weight_qtype: .*, got 'int3'"):
        quant.rules(load_config("test", [f"quant.rules={bad}"]))


def test_rules_that_do_not_fit_the_model_fail_before_training():
    config = load_config("test", ["quant.rules=int4"])  # tiles of 128 rows, d_model is 32
    with pytest.raises(ConfigError, match=r"quant\.rules='int4'.*tile_size=128 does not divide"):
        quant.apply(config, _model(config))


def test_missing_extra_names_the_pip_command(monkeypatch):
    real_import = builtins.__import__

    def without_quantlib(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "jaxstack" and fromlist and "quantlib" in fromlist:
            raise ImportError("No module named 'jaxstack.quantlib'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", without_quantlib)
    with pytest.raises(ConfigError, match=r"pip install 'jaxstack-trainer\[quant\]'"):
        quant.rules(load_config("test", ["quant.rules=int8"]))
    assert quant.rules(load_config("test")) is None  # unset: the extra is never needed


def _model(config):
    from flax import nnx

    from jaxstack import nnlib
    from jaxstack.trainer._src import model as model_mod

    return nnlib.Transformer(model_mod.model_config(config, 260), rngs=nnx.Rngs(0))


def _modules(model):
    from jaxstack import nnlib

    return nnlib.iter_modules(model)
