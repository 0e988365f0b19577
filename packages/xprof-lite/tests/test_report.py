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


def traced_logdir(path, *, save_hlo):
    step = jax.jit(train_step)
    jax.block_until_ready(step(PARAMS, X, Y))
    with xprof_lite.trace(path) as cap, xprof_lite.step_annotation(0):
        jax.block_until_ready(step(PARAMS, X, Y))
    if save_hlo:
        cap.save_hlo(step, PARAMS, X, Y)
    return path


def top_ops_sources(markdown):
    section = markdown.split("## Top ops", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    return [row.strip("| ").split(" | ")[-1] for row in rows]


def test_top_ops_source_column_keeps_the_start_of_a_name_or_marks_the_cut(tmp_path):
    def train_step_of_a_model_with_a_long_name(params, x, y):
        return train_step(params, x, y)

    paths = xprof_lite.report(
        train_step_of_a_model_with_a_long_name, PARAMS, X, Y, out_dir=tmp_path, runs=1, peak=PEAK
    )
    sources = [s for s in top_ops_sources(paths["markdown"].read_text()) if s != "-"]
    assert sources and any(s.startswith("…") for s in sources)  # long names are cut here
    assert all(s.startswith(("jit(", "…")) for s in sources), sources


def test_report_without_saved_hlo_says_flops_were_not_captured(tmp_path):
    logdir = traced_logdir(tmp_path / "log", save_hlo=False)
    out = tmp_path / "out"
    assert main(["report", str(logdir), "--out", str(out), "--peak-flops", "1e11",
                 "--peak-bandwidth", "1e10"]) == 0  # fmt: skip
    markdown = (out / "report.md").read_text()
    summary = markdown.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| FLOPs per run | not captured" in summary
    assert "| fraction of peak FLOP/s | not captured" in summary
    assert "| achieved FLOP/s | not captured" in summary
    assert "| 0 FLOP" not in summary and "0.0%" not in summary


def test_cli_refuses_unreadable_xplane_files_and_a_file_path_in_one_line(tmp_path, capsys):
    good = next(traced_logdir(tmp_path / "good", save_hlo=False).rglob("*.xplane.pb"))
    data = good.read_bytes()
    for name, content in [("truncated", data[: len(data) // 2]), ("empty", b""),
                          ("corrupt", bytes(range(256)) * 8)]:  # fmt: skip
        run = tmp_path / name / "plugins" / "profile" / "2026_01_01_00_00_00"
        run.mkdir(parents=True)
        (run / "host.xplane.pb").write_bytes(content)
        capsys.readouterr()
        assert main(["report", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "host.xplane.pb" in err, err
        assert not list((tmp_path / name).glob("report.*")), name  # nothing written
    capsys.readouterr()
    assert main(["report", str(good)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file" in err and "--out" in err, err


def test_without_matplotlib_the_report_keeps_its_tables_and_names_the_extra(tmp_path):
    import subprocess
    import sys

    # matplotlib is the `plots` extra: a process that cannot import it still writes the report.
    code = f"""
import sys, warnings
sys.modules["matplotlib"] = None
import jax.numpy as jnp
from jaxstack import xprof_lite
peak = xprof_lite.DevicePeak("test", flops_per_s=1e11, bytes_per_s=1e10)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    paths = xprof_lite.report(lambda x: x @ x, jnp.ones((64, 64)), out_dir={str(tmp_path)!r},
                              runs=1, peak=peak)
print("WARNING", *[str(w.message) for w in caught])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," not in html
    assert html.count("pip install &#x27;jaxstack-xprof-lite[plots]&#x27;") >= 2
    assert "<table>" in html and (tmp_path / "report.md").is_file()
    assert "has tables but no pictures" in done.stdout


def test_report_of_a_step_window_has_flops_memory_and_the_runs_peak(tmp_path):
    """A trainer's window: `step(step, executable=...)` saves the HLO and memory analysis, and
    the report reads the capture against the peak recorded with it (the run's MFU peak), at
    the matmuls' dtype (f32 here), not the bf16 figure."""
    step = jax.jit(train_step).lower(PARAMS, X, Y).compile()
    peak = xprof_lite.DevicePeak("run's peak", 1e11, 1e10, "measured", flops_per_s_f32=4e10)
    logdir = tmp_path / "profile"
    with xprof_lite.StepWindowProfiler(logdir, start_step=1, num_steps=2, peak=peak) as profiler:
        for i in range(4):
            with profiler.step(i, executable=step):
                jax.block_until_ready(step(PARAMS, X, Y))
    paths = xprof_lite.report_logdir(logdir, tmp_path / "report")
    data = json.loads(paths["json"].read_text())
    [profile] = data["profiles"]
    assert profile["hlo_captured"] and profile["by_category"]["matmul"]["flops"] > 0
    assert data["peak"]["flops_per_s_f32"] == 4e10
    assert data["compiled_memory"]["argument_bytes"] >= (64 * 128 + 128 * 16 + 32 * 80) * 4
    markdown = paths["markdown"].read_text()
    assert "| peak FLOP/s (f32, the matmuls' dtype) | 40 GFLOP/s |" in markdown
    assert "recorded with the capture" in markdown and "not captured" not in markdown
