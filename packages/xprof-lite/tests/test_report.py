"""HTML/Markdown reports from a function and from a captured logdir, and the CLI."""

import json

import jax
import jax.numpy as jnp

from jaxstack import xprof_lite
from jaxstack.xprof_lite._src.cli import main
from jaxstack.xprof_lite._src.report import SECTIONS

PEAK = xprof_lite.DevicePeak("test", flops_per_s=1e11, bytes_per_s=1e10)


def train_step(params, x, y):
    def loss(p):
        h = jax.nn.relu(x @ p["w1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


PARAMS = {"w1": jnp.ones((64, 128)) * 0.01, "w2": jnp.ones((128, 16)) * 0.01}
X, Y = jnp.ones((32, 64)), jnp.zeros((32, 16))


def assert_sections(html: str, markdown: str) -> None:
    for section in SECTIONS:
        assert f">{section}</h2>" in html
        assert f"## {section}" in markdown


def test_report_of_a_function(tmp_path):
    paths = xprof_lite.report(
        train_step, PARAMS, X, Y, out_dir=tmp_path, runs=2, peak=PEAK, named={"params": PARAMS}
    )
    html, markdown = paths["html"].read_text(), paths["markdown"].read_text()
    assert_sections(html, markdown)
    assert html.count("data:image/png;base64,") == 4  # roofline, categories, memory, steps
    data = json.loads(paths["json"].read_text())
    [profile] = data["profiles"]
    matmul_flops = profile["by_category"]["matmul"]["flops"]
    # forward x@w1, h@w2; backward two for w-grads and one for the h-grad.
    assert matmul_flops == 2 * 32 * 64 * 128 * 2 + 2 * 32 * 128 * 16 * 3
    assert profile["module_runs"] == 2
    assert [s["step"] for s in data["steps"]] == [0, 1]
    assert data["live_bytes_by_origin"]["params"] == (64 * 128 + 128 * 16) * 4
    assert "| matmul |" in markdown
    # The trace the report made is itself a logdir XProf can open.
    assert xprof_lite.load_trace(tmp_path / "trace") is not None


def test_cli_report_and_export_of_a_logdir(tmp_path, capsys):
    step = jax.jit(train_step)
    jax.block_until_ready(step(PARAMS, X, Y))
    logdir = tmp_path / "log"
    with xprof_lite.trace(logdir) as cap:
        for i in range(2):
            with xprof_lite.step_annotation(i):
                jax.block_until_ready(step(PARAMS, X, Y))
    cap.save_hlo(step, PARAMS, X, Y)
    out = tmp_path / "out"
    argv = ["report", str(logdir), "--out", str(out), "--peak-flops", "1e11"]
    assert main([*argv, "--peak-bandwidth", "1e10"]) == 0
    assert_sections((out / "report.html").read_text(), (out / "report.md").read_text())
    data = json.loads((out / "report.json").read_text())
    [profile] = [p for p in data["profiles"] if p["module"] == "jit_train_step"]
    assert profile["total_flops"] > 2 * 32 * 64 * 128 * 2  # FLOPs from the saved HLO
    assert profile["module_runs"] == 2

    target = tmp_path / "trace.json"
    assert main(["export", str(logdir), "--out", str(target)]) == 0
    assert "traceEvents" in json.loads(target.read_text())

    capsys.readouterr()
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "xplane" in capsys.readouterr().err
