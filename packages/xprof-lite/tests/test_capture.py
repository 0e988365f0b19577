"""Capture into an XProf logdir, Chrome trace export, HLO-op times and step breakdowns."""

import json
import os
import signal
import time
import urllib.error
import urllib.request

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

from jaxstack import xprof_lite


@jax.jit
def matmul(a, b):
    return jnp.tanh(a @ b)


A = jnp.ones((64, 128))
B = jnp.ones((128, 32))


def test_trace_writes_an_xprof_logdir_and_a_chrome_trace(tmp_path):
    jax.block_until_ready(matmul(A, B))
    with xprof_lite.trace(tmp_path) as cap:
        for step in range(3):
            with xprof_lite.step_annotation(step):
                jax.block_until_ready(matmul(A, B))
    assert cap.xplane_path.parent.parent.name == "profile"
    assert cap.xplane_path.name.endswith(".xplane.pb")
    data = ProfileData.from_file(str(cap.xplane_path))
    assert [w.step for w in xprof_lite.step_windows(data)] == [0, 1, 2]
    chrome = json.loads(cap.chrome_trace_path.read_text())
    assert any(e.get("name") == "train" for e in chrome["traceEvents"])
    assert cap.perfetto_trace_path.exists()
    times = xprof_lite.hlo_op_times(data)
    module_ops = {op: t for (module, op), t in times.items() if module == "jit_matmul"}
    assert module_ops and all(t.occurrences == 3 for t in module_ops.values())


def test_op_profile_joins_measured_times():
    prof = xprof_lite.op_profile(matmul, A, B, measure=4)
    assert prof.module_runs == 4
    op = next(op for op in prof.ops if op.category == "matmul")
    assert op.flops == 2 * 64 * 32 * 128
    assert op.occurrences == 4 and op.time_ns > 0


def test_op_profile_from_an_existing_trace(tmp_path):
    jax.block_until_ready(matmul(A, B))
    with xprof_lite.trace(tmp_path):
        jax.block_until_ready(matmul(A, B))
        jax.block_until_ready(matmul(A, B))
    prof = xprof_lite.op_profile(matmul, A, B, trace_data=tmp_path)
    assert prof.module_runs == 2
    assert prof.total_time_ns > 0


def test_step_breakdown_splits_data_wait_and_compile(tmp_path):
    jax.block_until_ready(matmul(A, B))
    with xprof_lite.trace(tmp_path) as cap:
        for step in range(3):
            with xprof_lite.step_annotation(step):
                with xprof_lite.host_event(xprof_lite.DATA_WAIT):
                    time.sleep(0.02)
                if step == 1:  # a new function: compiled inside this step
                    jax.block_until_ready(jax.jit(lambda x, s=step: x * 3.0 + s)(A))
                jax.block_until_ready(matmul(A, B))
    rows = xprof_lite.step_breakdown(cap.xplane_path)
    assert [r.step for r in rows] == [0, 1, 2]
    for r in rows:
        assert r.data_wait_ms >= 20.0
        parts = r.compute_ms + r.data_wait_ms + r.compile_ms + r.checkpoint_ms
        assert parts == pytest.approx(r.total_ms)
        assert r.device_busy_ms > 0
    assert rows[1].compile_ms > 1.0
    assert rows[0].compile_ms == 0.0 and rows[2].compile_ms == 0.0


def run_steps(profiler, steps):
    for step in steps:
        with profiler.step(step):
            jax.block_until_ready(matmul(A, B))


def test_step_window_captures_exactly_steps_n_to_m(tmp_path):
    with xprof_lite.StepWindowProfiler(tmp_path, start_step=2, num_steps=2) as profiler:
        run_steps(profiler, range(6))
    [capture] = profiler.captures
    assert [w.step for w in xprof_lite.step_windows(capture.xplane_path)] == [2, 3]


def test_signal_and_http_triggers_capture_the_next_steps(tmp_path):
    with xprof_lite.StepWindowProfiler(tmp_path, num_steps=1) as profiler:
        profiler.install_signal_handler()
        run_steps(profiler, range(2))
        assert profiler.captures == []
        os.kill(os.getpid(), signal.SIGUSR2)
        assert profiler.pending
        run_steps(profiler, range(2, 4))
        port = profiler.serve_http()
        url = f"http://127.0.0.1:{port}/profile?steps=2"
        with urllib.request.urlopen(url) as reply:
            assert reply.status == 202
        with pytest.raises(urllib.error.HTTPError) as busy:
            urllib.request.urlopen(url)
        assert busy.value.code == 409
        run_steps(profiler, range(4, 8))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status") as reply:
            status = json.loads(reply.read())
    assert [
        [w.step for w in xprof_lite.step_windows(c.xplane_path)] for c in profiler.captures
    ] == [
        [2],
        [4, 5],
    ]
    assert len(status["captures"]) == 2 and not status["active"]
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)


def test_bad_requests_are_refused(tmp_path):
    profiler = xprof_lite.StepWindowProfiler(tmp_path)
    with pytest.raises(xprof_lite.Error, match="loopback"):
        profiler.serve_http(host="0.0.0.0")
    with pytest.raises(xprof_lite.Error, match="num_steps"):
        profiler.request(0)
    with pytest.raises(xprof_lite.Error, match="xplane"):
        xprof_lite.load_trace(tmp_path)


def test_a_compiled_function_is_profiled_as_is_and_traces_do_not_nest(tmp_path):
    compiled = matmul.lower(A, B).compile()
    prof = xprof_lite.op_profile(compiled, A, B, measure=2)
    assert prof.module_runs == 2
    outer, inner = xprof_lite.trace(tmp_path / "outer"), xprof_lite.trace(tmp_path / "inner")
    with outer, pytest.raises(xprof_lite.Error, match="one trace"), inner:
        pass


def test_profiler_from_a_trainer_config(tmp_path):
    config = {"logdir": str(tmp_path), "start_step": 1, "num_steps": 2, "http_port": 0}
    with xprof_lite.StepWindowProfiler.from_config(config) as profiler:
        port = profiler.serve_http()  # already serving: the same port comes back
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status") as reply:
            assert json.loads(reply.read())["logdir"] == str(tmp_path)
        run_steps(profiler, range(4))
    [capture] = profiler.captures
    assert [w.step for w in xprof_lite.step_windows(capture.xplane_path)] == [1, 2]
    with pytest.raises(xprof_lite.Error, match="start_stpe"):
        xprof_lite.StepWindowProfiler.from_config({"logdir": str(tmp_path), "start_stpe": 3})
