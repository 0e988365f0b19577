"""The run's HTML report: loss and throughput plots, a summary, goodput, config and a sample.

One self-contained file (`report.html`, PNGs embedded as base64) built from `metrics.jsonl`, so it
can be regenerated for any run directory with `write_report(run_dir)`.
"""

from __future__ import annotations

import base64
import html
import io
import pathlib
import statistics
from typing import Any

from jaxstack import ckptlib
from jaxstack.trainer._src.metrics_log import read_jsonl
from jaxstack.trainer._src.units import si


def write_report(run_dir: str | pathlib.Path, *, sample: str | None = None) -> pathlib.Path:
    """Writes `run_dir/report.html` from `run_dir/metrics.jsonl` (and `config.yaml`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = pathlib.Path(run_dir)
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = _last_per_step([r for r in records if r["kind"] == "train"])
    evals = _last_per_step([r for r in records if r["kind"] == "eval"])
    summaries = [r for r in records if r["kind"] == "summary"]
    summary = summaries[-1] if summaries else {}

    steps = [r["step"] for r in train]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(steps, [r["loss"] for r in train], lw=1, label="train loss")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    loss_png = _png(fig, plt)

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(steps, [r.get("tokens_per_sec", float("nan")) for r in train], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s")
    ax.grid(alpha=0.3)
    # MFU is tokens/s times a constant of the run (FLOPs per token over the peak): one line with
    # a second scale, not a second line drawn over the first.
    if (scale := _mfu_per_token_per_sec(train)) is not None:
        mfu_axis = ax.secondary_yaxis(
            "right", functions=(lambda t: 100 * scale * t, lambda m: m / (100 * scale))
        )
        mfu_axis.set_ylabel("MFU %")
    speed_png = _png(fig, plt)

    config_text = ""
    if (run_dir / "config.yaml").is_file():
        config_text = (run_dir / "config.yaml").read_text()
    summary_rows, goodput_rows = _summary_rows(summary), _goodput_rows(summary)
    body = f"""<!doctype html><html><head><meta charset="utf-8"><title>jaxstack-train report</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}
td{{padding:2px 12px}} pre{{background:#f4f4f4;padding:8px;overflow-x:auto}}</style></head><body>
<h1>jaxstack-train: {html.escape(run_dir.name)}</h1>
<h2>Loss</h2><img alt="loss curve" src="data:image/png;base64,{loss_png}">
<h2>Throughput</h2><img alt="throughput" src="data:image/png;base64,{speed_png}">
<h2>Summary</h2><table>{summary_rows}</table>
<h2>Goodput</h2><table>{goodput_rows}</table>
<h2>Sample</h2><pre>{html.escape(sample or summary.get("sample", "") or "")}</pre>
<h2>Config</h2><pre>{html.escape(config_text)}</pre>
</body></html>"""
    out = run_dir / "report.html"
    with ckptlib.atomic_file(out) as tmp:
        tmp.write_text(body)
    return out


def _last_per_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step = {r["step"]: r for r in records}
    return [by_step[s] for s in sorted(by_step)]


def _png(fig: Any, plt: Any) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _mfu_per_token_per_sec(train: list[dict[str, Any]]) -> float | None:
    """MFU / tokens_per_sec of the run (one constant), from the steps that logged both."""
    ratios = [
        r["mfu"] / r["tokens_per_sec"] for r in train if r.get("mfu") and r.get("tokens_per_sec")
    ]
    return statistics.median(ratios) if ratios else None


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def _seconds(value: float) -> str:
    return f"{value:,.3g} s"


# The summary record's fields as the report shows them: (key, label, format), in this order.
SUMMARY_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("final_step", "steps", str),
    ("median_tokens_per_sec", "tokens/s (median, steady state)", lambda v: f"{v:,.0f}"),
    ("median_step_time_s", "step time (median)", _seconds),
    ("median_mfu", "MFU (median)", _percent),
    ("eval_loss", "eval loss", lambda v: f"{v:.4f}"),
    ("eval_perplexity", "eval perplexity", lambda v: f"{v:.2f}"),
    ("eval_tokens", "eval tokens", lambda v: f"{int(v):,}"),
    ("num_params", "parameters", lambda v: si(v, "")),
    ("flops_per_token", "model FLOPs per token", lambda v: si(v, "FLOP")),
    ("peak_flops_per_device", "device peak (behind MFU)", lambda v: si(v, "FLOP/s")),
    ("peak_source", "device peak: source", str),
    ("mesh", "mesh (data x fsdp x tensor x expert)", str),
    ("host_allocator", "host allocator", str),
    ("matmul_backend", "CPU matmul backend", str),
    ("stopped", "stopped by", str),
)
# Shown elsewhere (the sample, the goodput table) or bookkeeping of the log (kind, step).
NOT_IN_SUMMARY = (
    "kind",
    "step",
    "sample",
    "first_loss",
    "final_loss",
    "goodput",
    "wall_s",
    "step_s",
)


def _row(label: str, text: str) -> str:
    return f"<tr><td>{html.escape(label)}</td><td>{html.escape(text)}</td></tr>"


def _summary_rows(summary: dict[str, Any]) -> str:
    rows = []
    if "first_loss" in summary and "final_loss" in summary:
        first, final = summary["first_loss"], summary["final_loss"]
        rows.append(_row("train loss, first -> last step", f"{first:.4f} -> {final:.4f}"))
    for key, label, fmt in SUMMARY_FIELDS:
        if summary.get(key) is not None:
            rows.append(_row(label, fmt(summary[key])))
    shown = {key for key, _, _ in SUMMARY_FIELDS} | set(NOT_IN_SUMMARY)
    for key, value in summary.items():
        if key not in shown and not key.startswith("lost_"):
            rows.append(_row(key, _fmt(value)))
    return "".join(rows)


def _goodput_rows(summary: dict[str, Any]) -> str:
    """Goodput, then the wall time split into training steps and each kind of lost time."""
    if "goodput" not in summary:
        return ""
    wall = summary.get("wall_s") or 0.0
    rows = [_row("goodput (step time / wall time)", _percent(summary["goodput"]))]
    parts = [("wall time", "wall_s"), ("training steps", "step_s")]
    parts += [
        (f"lost: {key.removeprefix('lost_').removesuffix('_s').replace('_', ' ')}", key)
        for key in summary
        if key.startswith("lost_")
    ]
    for label, key in parts:
        if key in summary:
            share = f" ({_percent(summary[key] / wall)})" if wall and key != "wall_s" else ""
            rows.append(_row(label, _seconds(summary[key]) + share))
    return "".join(rows)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return str(value)
