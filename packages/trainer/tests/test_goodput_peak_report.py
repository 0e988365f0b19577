import time

import pytest

from jaxstack.trainer import GoodputTracker, read_jsonl, write_report
from jaxstack.trainer._src.metrics_log import MetricsLog


def test_goodput_buckets_sum_to_wall_time_and_goodput_is_a_fraction():
    g = GoodputTracker()
    with g.measure("startup"):
        time.sleep(0.02)
    with g.measure("step"):
        time.sleep(0.03)
    t = time.perf_counter()
    time.sleep(0.01)
    g.add("checkpoint", time.perf_counter() - t)
    s = g.summary()
    lost = sum(v for k, v in s.items() if k.startswith("lost_"))
    assert s["step_s"] + lost == pytest.approx(s["wall_s"], abs=1e-9)
    assert s["lost_startup_s"] >= 0.02 and s["step_s"] >= 0.03 and s["lost_other_s"] >= 0
    assert 0.0 < s["goodput"] < 1.0
    assert s["goodput"] == pytest.approx(s["step_s"] / s["wall_s"])
    with pytest.raises(KeyError, match="unknown goodput bucket"):
        g.add("lunch", 1.0)


def test_goodput_refuses_time_counted_twice():
    g = GoodputTracker()
    # more seconds than have passed (the 2.47 goodput of issue #15 came from such sums)
    with pytest.raises(ValueError, match="not attributed yet"):
        g.add("step", 5.0)
    with pytest.raises(RuntimeError, match="measured inside 'eval'"):  # noqa: SIM117
        with g.measure("eval"), g.measure("step"):
            pass
    with pytest.raises(ValueError, match="in the future"):
        GoodputTracker(start=time.perf_counter() + 100)
    assert g.summary()["goodput"] == 0.0


def test_metrics_log_and_report(tmp_path):
    log = MetricsLog(tmp_path, total_steps=3, every=1, tensorboard=True, progress="plain")
    log.start(0)
    for step in (1, 2, 3):
        log.train(step, {"loss": 5.0 - step, "tokens_per_sec": 1000.0 * step, "mfu": 0.1})
    log.eval(3, {"eval_loss": 2.5, "eval_perplexity": 12.2})
    log.summary(3, {"median_mfu": 0.1234, "goodput": 0.5, "wall_s": 2.0, "sample": "def f():"})
    log.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["kind"] for r in records] == ["train"] * 3 + ["eval", "summary"]
    assert records[2]["loss"] == 2.0
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    path = write_report(tmp_path)
    html = path.read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "def f():" in html and "goodput" in html
    # MFU in percent, and none of the log's own bookkeeping (its `kind: summary` field) shown.
    assert "<td>MFU (median)</td><td>12.3%</td>" in html
    assert "<td>goodput (step time / wall time)</td><td>50.0%</td>" in html
    assert "<td>kind</td>" not in html and ">summary</td>" not in html


def test_rich_progress_mode_logs_the_same_records(tmp_path, capsys):
    log = MetricsLog(tmp_path, total_steps=2, every=1, tensorboard=False, progress="rich")
    log.start(0)
    log.info("hello from the run")
    log.train(1, {"loss": 3.0})
    log.train(2, {"loss": 2.0})
    log.close()
    assert [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [3.0, 2.0]
    assert "hello from the run" in capsys.readouterr().out
