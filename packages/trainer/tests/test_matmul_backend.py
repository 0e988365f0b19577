"""train.matmul_backend: XLA's default or oneDNN matmuls, fixed or chosen by a timed trial."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack.trainer import ConfigError, load_config, read_jsonl, train
from jaxstack.trainer._src.matmul_backend import (
    ONEDNN,
    compile_step,
    record,
    recorded,
    why_not_trial,
)
from jaxstack.xprof_lite import HostCPU

# XLA's oneDNN rewriter leaves small products alone (the `test` preset's are all too small);
# with 1,024 tokens a step, the weight gradients ([128 or 256, tokens] x [tokens, ...]) qualify.
BIG_ENOUGH = ["model.d_model=128", "model.mlp_dim=256", "model.max_seq_len=128", "data.seq_len=128"]


def _onednn_takes_dots() -> bool:
    """Whether XLA sends a weight-gradient product of BIG_ENOUGH's shape to oneDNN here."""
    tokens = jnp.ones((1024, 128))
    lowered = jax.jit(lambda x, dy: x.T @ dy).lower(tokens, jnp.ones((1024, 256)))
    try:
        return "__onednn$" in lowered.compile(compiler_options=ONEDNN).as_text()
    except jax.errors.JaxRuntimeError:
        return False


needs_onednn = pytest.mark.skipif(
    not _onednn_takes_dots(), reason="this jaxlib or CPU sends no matmul to oneDNN"
)


def _losses(run_dir) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


@needs_onednn
def test_onednn_matmuls_train_the_same_model(tmp_path):
    runs = {}
    for backend in ("default", "onednn"):
        overrides = [
            *BIG_ENOUGH,
            f"log.run_dir={tmp_path / backend}",
            "train.steps=12",
            f"train.matmul_backend={backend}",
            "checkpoint.enabled=false",
            "log.sample_tokens=0",
        ]
        runs[backend] = train(load_config("test", overrides))
        assert runs[backend].summary["matmul_backend"] == backend
    # The same products summed in another order: equal to float32 rounding, step by step.
    np.testing.assert_allclose(
        _losses(tmp_path / "onednn"), _losses(tmp_path / "default"), rtol=1e-4
    )
    for a, b in zip(
        jax.tree.leaves(runs["onednn"].state["params"]),
        jax.tree.leaves(runs["default"].state["params"]),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@needs_onednn
def test_auto_times_both_backends_and_a_resumed_run_keeps_the_choice(tmp_path, capsys):
    overrides = [
        *BIG_ENOUGH,
        f"log.run_dir={tmp_path}",
        "checkpoint.every=40",
        "eval.every=40",
        "log.sample_tokens=0",
    ]
    first = train(load_config("test", [*overrides, "train.steps=40"]))
    times = first.summary["matmul_backend_trial_step_s"]
    assert {backend: len(t) for backend, t in times.items()} == {"default": 4, "onednn": 4}
    # The allocator trial (12 steps) runs first, then this one (12 steps).
    assert sum(map(len, first.summary["host_allocator_trial_step_s"].values())) == 8
    chosen = first.summary["matmul_backend"]
    assert chosen in times
    assert f"matmul backend: {chosen} (median step: default " in capsys.readouterr().out
    # 5 more steps would be too few for a trial: the checkpoint's choice is kept instead.
    resumed = train(load_config("test", [*overrides, "train.steps=45"]))
    assert resumed.step == 45 and resumed.summary["matmul_backend"] == chosen
    out = capsys.readouterr().out
    assert f"matmul backend: {chosen} (as the checkpoint's run chose on this CPU)" in out


def test_auto_in_a_short_run_keeps_the_default_and_says_why(tmp_path, capsys):
    overrides = [f"log.run_dir={tmp_path}", "train.steps=3", "checkpoint.enabled=false"]
    result = train(load_config("test", overrides))
    assert result.summary["matmul_backend"] == "default"
    assert "matmul_backend_trial_step_s" not in result.summary
    out = capsys.readouterr().out
    assert "matmul backend: default (no trial: fewer than 40 steps to run)" in out


def test_a_recorded_choice_is_kept_only_on_the_cpu_that_made_it():
    assert recorded({"config": {}, "matmul_backend": record("onednn")}) == "onednn"
    assert recorded({"matmul_backend": {"backend": "onednn", "cpu": "another CPU"}}) is None
    assert recorded({"config": {}}) is None
    assert recorded(None) is None


def test_onednn_for_a_step_without_matmuls_is_a_config_error_with_the_fix():
    lowered = jax.jit(jnp.tanh).lower(jnp.ones((8, 8)))
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    fix = r"train\.matmul_backend=onednn: .*matmul_backend=default"
    with pytest.raises(ConfigError, match=fix):
        compile_step(lowered, "onednn")
    # The compile ran outside JAX's persistent cache; later compiles use it again.
    assert jax.config.jax_persistent_cache_min_compile_time_secs == before


def test_bfloat16_compute_gets_a_trial_only_on_cpus_with_bf16_instructions():
    config = load_config("test", ["train.steps=100"])
    avx512 = HostCPU("Intel Xeon", ("avx2", "fma", "avx512f", "avx512_vnni"), 2)
    amx = HostCPU("Intel Xeon", ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"), 2)
    assert why_not_trial(config, "cpu", 1, 0, "float32", avx512) is None
    assert why_not_trial(config, "cpu", 1, 0, "bfloat16", amx) is None
    why = why_not_trial(config, "cpu", 1, 0, "bfloat16", avx512)
    assert why.startswith("oneDNN's bfloat16 matmuls need AVX512-BF16 or AMX")
    assert "processes" in why_not_trial(config, "cpu", 2, 0, "float32", avx512)
    assert "on gpu" in why_not_trial(config, "gpu", 1, 0, "float32", avx512)


def test_unknown_backend_is_refused_with_the_choices():
    choices = r"'auto', 'default' or 'onednn', got 'mkl'$"
    with pytest.raises(ConfigError, match=r"^train\.matmul_backend: Input should be " + choices):
        load_config("test", ["train.matmul_backend=mkl"])
