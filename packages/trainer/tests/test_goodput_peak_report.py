import json
import time

import jax
import pytest

from jaxstack.trainer import GoodputTracker, device_peak, read_jsonl, write_report
from jaxstack.trainer._src.metrics_log import MetricsLog


def test_goodput_buckets_sum_to_wall_time():
    g = GoodputTracker()
    with g.measure("startup"):
        time.sleep(0.02)
    g.add("step", 0.05)
    g.add("checkpoint", 0.01)
    s = g.summary()
    lost = sum(v for k, v in s.items() if k.startswith("lost_"))
    assert s["step_s"] + lost == pytest.approx(s["wall_s"], rel=1e-6, abs=1e-3) or (
        s["step_s"] + lost > s["wall_s"]
    )
    assert s["lost_startup_s"] >= 0.02
    assert 0.0 < s["goodput"] <= 1.0 or s["step_s"] > s["wall_s"]
    with pytest.raises(KeyError, match="unknown goodput bucket"):
        g.add("lunch", 1.0)


def test_cpu_peak_is_measured_and_the_best_is_cached(tmp_path):
    p1 = device_peak("float32", cache_dir=tmp_path)
    assert p1.flops_per_sec > 1e9  # any CPU of this decade does > 1 GFLOP/s
    assert "measured" in p1.source
    cached = json.loads((tmp_path / "device_peak.json").read_text())
    assert list(cached.values()) == [p1.flops_per_sec]
    # a lower (busy-machine) measurement never lowers the cached peak
    key = next(iter(cached))
    (tmp_path / "device_peak.json").write_text(json.dumps({key: 1e15}))
    p2 = device_peak("float32", cache_dir=tmp_path)
    assert p2.flops_per_sec == 1e15 and "cached" in p2.source
    assert "GFLOP/s" in p2.describe()


def test_peak_override_and_spec_table():
    assert device_peak(override=1e12).flops_per_sec == 1e12

    class FakeH100:
        device_kind = "NVIDIA H100 80GB HBM3"
        platform = "gpu"

    peak = device_peak("bfloat16", FakeH100())
    assert peak.flops_per_sec == 989e12 and "spec table" in peak.source
    assert jax.devices()[0].platform == "cpu"


def test_metrics_log_and_report(tmp_path):
    log = MetricsLog(tmp_path, total_steps=3, every=1, tensorboard=True, progress="plain")
    log.start(0)
    for step in (1, 2, 3):
        log.train(step, {"loss": 5.0 - step, "tokens_per_sec": 1000.0 * step, "mfu": 0.1})
    log.eval(3, {"eval_loss": 2.5, "eval_perplexity": 12.2})
    log.summary(3, {"goodput": 0.5, "sample": "def f():"})
    log.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["kind"] for r in records] == ["train"] * 3 + ["eval", "summary"]
    assert records[2]["loss"] == 2.0
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    path = write_report(tmp_path)
    html = path.read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "def f():" in html and "goodput" in html


def test_rich_progress_mode_logs_the_same_records(tmp_path, capsys):
    log = MetricsLog(tmp_path, total_steps=2, every=1, tensorboard=False, progress="rich")
    log.start(0)
    log.info("hello from the run")
    log.train(1, {"loss": 3.0})
    log.train(2, {"loss": 2.0})
    log.close()
    assert [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [3.0, 2.0]
    assert "hello from the run" in capsys.readouterr().out
