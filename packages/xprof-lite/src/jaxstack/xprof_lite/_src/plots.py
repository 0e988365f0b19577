"""The report's pictures, drawn with matplotlib's object API (no pyplot state, no display) and
returned as base64 PNGs to embed in one self-contained HTML file.

matplotlib is the `plots` extra: without it `AVAILABLE` is False and reports carry `MISSING` in
place of each picture (their tables and numbers need no plotting library)."""

from __future__ import annotations

import base64
import io

try:
    from matplotlib.figure import Figure
except ModuleNotFoundError as e:
    if (e.name or "").partition(".")[0] != "matplotlib":
        raise
    Figure = None

from jaxstack.xprof_lite._src.cost import CATEGORIES
from jaxstack.xprof_lite._src.peak import DevicePeak
from jaxstack.xprof_lite._src.roofline import RooflinePoint
from jaxstack.xprof_lite._src.steps import StepBreakdown

AVAILABLE = Figure is not None
MISSING = "plots need matplotlib: pip install 'jaxstack-xprof-lite[plots]'"
COLORS = dict(
    zip(CATEGORIES, ["#1f77b4", "#9467bd", "#2ca02c", "#d62728", "#ff7f0e", "#7f7f7f"], strict=True)
)


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def roofline_png(points: list[RooflinePoint], peak: DevicePeak) -> str:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    usable = [p for p in points if p.intensity > 0 and p.intensity != float("inf")]
    lo = min([p.intensity for p in usable] + [peak.ridge_intensity / 100]) / 2
    hi = max([p.intensity for p in usable] + [peak.ridge_intensity * 10]) * 2
    xs = [lo, peak.ridge_intensity, hi]
    ax.plot(xs, [min(peak.flops_per_s, x * peak.bytes_per_s) for x in xs], "k-", label="roofline")
    for category in CATEGORIES:
        mine = [p for p in usable if p.category == category]
        if not mine:
            continue
        ys = [p.achieved_flops_per_s or p.attainable_flops_per_s for p in mine]
        ax.scatter([p.intensity for p in mine], ys, s=18, color=COLORS[category], label=category)
    measured = any(p.achieved_flops_per_s for p in usable)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP/byte)",
        ylabel="achieved FLOP/s" if measured else "attainable FLOP/s (no trace)",
        title=f"Roofline: {peak.name}",
    )
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return _png(fig)


def memory_png(compiled: dict[str, int], by_origin: dict[str, int]) -> str:
    fig = Figure(figsize=(7, 3.2))
    # A trace read back later has no live arrays: then the compiled function's panel alone.
    panels = [p for p in (compiled, by_origin) if p]
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    if compiled:
        names = [k for k, v in compiled.items() if v]
        axes[0].barh(names, [compiled[k] / 2**20 for k in names], color="#1f77b4")
        axes[0].set(xlabel="MiB", title="compiled function")
    if by_origin:
        top = list(by_origin.items())[:8]
        axes[-1].barh([k[:28] for k, _ in top], [v / 2**20 for _, v in top], color="#ff7f0e")
        axes[-1].set(xlabel="MiB", title="live arrays by origin")
    fig.tight_layout()
    return _png(fig)


def step_timeline_png(steps: list[StepBreakdown]) -> str:
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    labels = [str(s.step) for s in steps]
    bottom = [0.0] * len(steps)
    parts = [
        ("compute", "compute_ms", "#1f77b4"),
        ("data wait", "data_wait_ms", "#ff7f0e"),
        ("compile", "compile_ms", "#d62728"),
        ("checkpoint", "checkpoint_ms", "#2ca02c"),
    ]
    for label, field, color in parts:
        values = [getattr(s, field) for s in steps]
        ax.bar(labels, values, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(xlabel="step", ylabel="ms", title="step time breakdown")
    ax.legend(fontsize=8)
    return _png(fig)


def category_png(by_category: dict[str, dict[str, float]], measured: bool) -> str:
    fig = Figure(figsize=(7, 2.8))
    ax = fig.add_subplot()
    key = "time_ns" if measured else "flops"
    cats = [c for c in CATEGORIES if by_category[c]["ops"]]
    values = [by_category[c][key] / (1e3 if measured else 1.0) for c in cats]
    ax.barh(cats, values, color=[COLORS[c] for c in cats])
    ax.set(xlabel="µs per run" if measured else "FLOPs", title="ops by category")
    return _png(fig)
