"""The run's HTML report: loss and throughput plots, goodput breakdown, config and a sample.

One self-contained file (`report.html`, PNGs embedded as base64) built from `metrics.jsonl`, so it
can be regenerated for any run directory with `write_report(run_dir)`.
"""

from __future__ import annotations

import base64
import html
import io
import pathlib
from typing import Any

from jaxstack.trainer._src.metrics_log import read_jsonl


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
    if train and "mfu" in train[-1]:
        ax2 = ax.twinx()
        ax2.plot(steps, [100 * r.get("mfu", float("nan")) for r in train], lw=0.6, color="C1")
        ax2.set_ylabel("MFU %", color="C1")
    speed_png = _png(fig, plt)

    config_text = ""
    if (run_dir / "config.yaml").is_file():
        config_text = (run_dir / "config.yaml").read_text()
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{_fmt(v)}</td></tr>" for k, v in summary.items()
    )
    body = f"""<!doctype html><html><head><meta charset="utf-8"><title>jaxstack-train report</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}
td{{padding:2px 12px}} pre{{background:#f4f4f4;padding:8px;overflow-x:auto}}</style></head><body>
<h1>jaxstack-train: {html.escape(run_dir.name)}</h1>
<h2>Loss</h2><img alt="loss curve" src="data:image/png;base64,{loss_png}">
<h2>Throughput</h2><img alt="throughput" src="data:image/png;base64,{speed_png}">
<h2>Summary and goodput</h2><table>{rows}</table>
<h2>Sample</h2><pre>{html.escape(sample or summary.get("sample", "") or "")}</pre>
<h2>Config</h2><pre>{html.escape(config_text)}</pre>
</body></html>"""
    out = run_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(body)
    tmp.replace(out)
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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    return html.escape(str(value))
