"""Reports: one self-contained HTML page (plots embedded as PNG) plus a Markdown summary and the
numbers as JSON, for a function (`report(fn, *args)`) or a captured logdir (`report_logdir`)."""

from __future__ import annotations

import dataclasses
import datetime
import html
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from jaxstack.xprof_lite._src import plots, tracefile
from jaxstack.xprof_lite._src.annotate import step_annotation
from jaxstack.xprof_lite._src.capture import (
    compile_fn,
    memory_analysis_dict,
    saved_hlo_texts,
    saved_memory,
    saved_peak,
    trace,
)
from jaxstack.xprof_lite._src.cost import CATEGORIES
from jaxstack.xprof_lite._src.errors import Error
from jaxstack.xprof_lite._src.files import write_text_atomically
from jaxstack.xprof_lite._src.memory import (
    live_arrays,
    live_bytes_by_origin,
    peak_memory_per_step,
)
from jaxstack.xprof_lite._src.op_profile import (
    OpProfile,
    analyze_hlo,
    join_times,
    profile_from_trace,
)
from jaxstack.xprof_lite._src.peak import DevicePeak, device_peak
from jaxstack.xprof_lite._src.roofline import RooflinePoint, roofline
from jaxstack.xprof_lite._src.steps import StepBreakdown, step_breakdown

SECTIONS = ("Summary", "Roofline", "Top ops", "Ops by category", "Memory", "Step timeline")


@dataclasses.dataclass
class Report:
    """Everything a report shows; `write(out_dir)` renders it."""

    title: str
    peak: DevicePeak
    profiles: list[OpProfile]
    compiled_memory: dict[str, int] = dataclasses.field(default_factory=dict)
    live_by_origin: dict[str, int] = dataclasses.field(default_factory=dict)
    steps: list[StepBreakdown] = dataclasses.field(default_factory=list)
    step_peak_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    logdir: str | None = None
    top_n: int = 25

    @property
    def points(self) -> list[RooflinePoint]:
        return [p for prof in self.profiles for p in roofline(prof, self.peak)]

    @property
    def compute_dtype(self) -> str | None:
        """The dtype of most of the matmul FLOPs in the saved HLO (None without HLO)."""
        flops: dict[str, float] = {}
        for prof in self.profiles:
            for op in prof.ops if prof.hlo_captured else ():
                if op.category in ("matmul", "attention") and op.dtype:
                    flops[op.dtype] = flops.get(op.dtype, 0.0) + op.total_flops
        return max(flops, key=flops.get) if flops else None

    @property
    def roof(self) -> DevicePeak:
        """The peak at the profile's compute dtype (f32 matmuls have their own FLOP/s rate):
        the figure MFU is measured against for the same work, and the roofline plot's roof."""
        return dataclasses.replace(self.peak, flops_per_s=self.peak.flops_for(self.compute_dtype))

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "peak": self.peak.to_dict(),
            "profiles": [p.to_dict() for p in self.profiles],
            "roofline": [dataclasses.asdict(p) for p in self.points],
            "compiled_memory": self.compiled_memory,
            "live_bytes_by_origin": self.live_by_origin,
            "steps": [dataclasses.asdict(s) for s in self.steps],
            "step_peak_bytes": self.step_peak_bytes,
            "logdir": self.logdir,
        }

    def write(self, out_dir: str | os.PathLike) -> dict[str, Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {
            "html": (out / "report.html", render_html(self)),
            "markdown": (out / "report.md", render_markdown(self)),
            "json": (out / "report.json", json.dumps(self.to_dict(), indent=1, default=str)),
        }
        for path, text in files.values():
            write_text_atomically(path, text)
        if not plots.AVAILABLE:
            html_path = files["html"][0]
            warnings.warn(f"{html_path} has tables but no pictures: {plots.MISSING}", stacklevel=2)
        return {k: path for k, (path, _) in files.items()}


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".strip()


def _fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


NOT_CAPTURED = (
    "not captured (save the HLO: Capture.save_hlo, or StepWindowProfiler.step(step, executable=))"
)


def _summary_rows(r: Report) -> list[tuple[str, str]]:
    # FLOPs and bytes come from saved HLO only; a module seen only in the trace has times.
    counted = [p for p in r.profiles if p.hlo_captured]
    flops = sum(p.total_flops for p in counted)
    nbytes = sum(p.total_bytes for p in counted)
    time_ns = sum(p.total_time_ns for p in r.profiles)
    counted_ns = sum(p.total_time_ns for p in counted)
    roof, dtype = r.roof, r.compute_dtype
    rows = [("device", f"{r.peak.name} ({r.peak.source})")]
    if dtype is None:
        rows.append(("peak FLOP/s", _fmt(r.peak.flops_per_s, "FLOP/s")))
        if r.peak.flops_per_s_f32 and r.peak.flops_per_s_f32 != r.peak.flops_per_s:
            rows[-1] = ("peak FLOP/s (bf16)", rows[-1][1])
            rows.append(("peak FLOP/s (f32)", _fmt(r.peak.flops_per_s_f32, "FLOP/s")))
    else:
        rows.append(
            (f"peak FLOP/s ({dtype}, the matmuls' dtype)", _fmt(roof.flops_per_s, "FLOP/s"))
        )
        if roof.flops_per_s != r.peak.flops_per_s:
            rows.append(("peak FLOP/s (bf16)", _fmt(r.peak.flops_per_s, "FLOP/s")))
    rows += [
        ("peak bandwidth", _fmt(r.peak.bytes_per_s, "B/s")),
        ("ridge intensity", f"{roof.ridge_intensity:.1f} FLOP/B"),
        ("modules", ", ".join(p.module for p in r.profiles) or "-"),
        ("ops", str(sum(len(p.ops) for p in r.profiles))),
        ("FLOPs per run", _fmt(flops, "FLOP") if counted else NOT_CAPTURED),
        ("bytes per run", _fmt(nbytes, "B") if counted else NOT_CAPTURED),
    ]
    if time_ns:
        rows.append(("measured op time per run", _fmt_ns(time_ns)))
        achieved = flops / (counted_ns * 1e-9) if counted_ns else None
        rows += [
            ("achieved FLOP/s", NOT_CAPTURED if achieved is None else _fmt(achieved, "FLOP/s")),
            (
                "fraction of peak FLOP/s",
                NOT_CAPTURED if achieved is None else _pct(achieved / roof.flops_per_s),
            ),
        ]
    if r.steps:
        mean = sum(s.total_ms for s in r.steps) / len(r.steps)
        rows.append(("steps traced", f"{len(r.steps)} (mean {mean:.2f} ms)"))
    return rows


def _top_rows(r: Report) -> list[list[str]]:
    points = {(p.op, p.category): p for p in r.points}
    ops = sorted(
        (op for prof in r.profiles for op in prof.ops),
        key=lambda o: (o.time_ns or 0.0, o.total_flops),
        reverse=True,
    )[: r.top_n]
    captured = {p.module for p in r.profiles if p.hlo_captured}
    rows = []
    for op in ops:
        p = points.get((op.name, op.category))
        known = op.module in captured
        rows.append([
            op.name, op.category, op.opcode, op.shape[:32],
            _fmt(op.total_flops) if known else "not captured",
            _fmt(op.total_bytes, "B") if known else "not captured",
            f"{op.intensity:.2f}" if p else "-",
            p.bound if p else "-", _fmt_ns(op.time_ns),
            _pct(p.achieved_fraction if p else None), _tail(op.op_name, 48),
        ])  # fmt: skip
    return rows


def _tail(text: str, width: int) -> str:
    """The end of a long op name (its most specific part), marked as cut with a leading …."""
    return text if len(text) <= width else "…" + text[-(width - 1) :]


TOP_HEADER = [
    "op", "category", "opcode", "shape", "FLOPs", "bytes", "FLOP/B", "bound", "time/run",
    "of roofline", "source",
]  # fmt: skip


def _category_rows(r: Report) -> list[list[str]]:
    totals = {c: {"ops": 0, "flops": 0.0, "bytes": 0.0, "time_ns": 0.0} for c in CATEGORIES}
    for prof in r.profiles:
        for c, g in prof.by_category().items():
            for k in g:
                totals[c][k] += g[k]
    all_time = sum(g["time_ns"] for g in totals.values()) or None
    captured = any(p.hlo_captured for p in r.profiles)
    return [
        [c, str(int(g["ops"])), _fmt(g["flops"]) if captured else "not captured",
         _fmt(g["bytes"], "B") if captured else "not captured",
         _fmt_ns(g["time_ns"] if all_time else None),
         _pct(g["time_ns"] / all_time if all_time else None)]
        for c, g in totals.items()
        if g["ops"]
    ]  # fmt: skip


CATEGORY_HEADER = ["category", "ops", "FLOPs", "bytes", "time/run", "share of time"]
STEP_HEADER = ["step", "total ms", "compute ms", "data wait ms", "compile ms", "checkpoint ms",
               "device busy ms", "peak memory"]  # fmt: skip


def _step_rows(r: Report) -> list[list[str]]:
    return [
        [str(s.step), f"{s.total_ms:.3f}", f"{s.compute_ms:.3f}", f"{s.data_wait_ms:.3f}",
         f"{s.compile_ms:.3f}", f"{s.checkpoint_ms:.3f}", f"{s.device_busy_ms:.3f}",
         _fmt(r.step_peak_bytes.get(s.step), "B")]
        for s in r.steps
    ]  # fmt: skip


def _memory_rows(r: Report) -> list[list[str]]:
    rows = [["compiled: " + k, _fmt(v, "B")] for k, v in r.compiled_memory.items()]
    rows += [["live: " + k, _fmt(v, "B")] for k, v in list(r.live_by_origin.items())[:15]]
    return rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return "_none_\n"
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_markdown(r: Report) -> str:
    parts = [f"# {r.title}\n", "## Summary\n"]
    parts.append(_md_table(["", ""], [list(row) for row in _summary_rows(r)]))
    bounds = {"compute": 0, "memory": 0}
    for p in r.points:
        bounds[p.bound] += 1
    parts += [
        "\n## Roofline\n",
        f"{bounds['compute']} compute-bound and {bounds['memory']} memory-bound ops "
        f"(ridge at {r.roof.ridge_intensity:.1f} FLOP/B); the plot is in report.html.\n",
        "\n## Top ops\n", _md_table(TOP_HEADER, _top_rows(r)),
        "\n## Ops by category\n", _md_table(CATEGORY_HEADER, _category_rows(r)),
        "\n## Memory\n", _md_table(["what", "bytes"], _memory_rows(r)),
        "\n## Step timeline\n", _md_table(STEP_HEADER, _step_rows(r)),
    ]  # fmt: skip
    return "".join(parts)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _picture(draw: Callable[..., str], alt: str, *args: Any) -> str:
    """`draw(*args)` embedded as a PNG, or the note saying how to get plots."""
    if not plots.AVAILABLE:
        return f"<p><em>{html.escape(plots.MISSING)}</em></p>"
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{draw(*args)}">'


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;
padding:3px 6px;text-align:left}th{background:#f3f3f3}img{max-width:100%}"""


def render_html(r: Report) -> str:
    points = r.points
    by_category = {c: {"ops": 0, "flops": 0.0, "time_ns": 0.0} for c in CATEGORIES}
    for prof in r.profiles:
        for c, g in prof.by_category().items():
            for k in by_category[c]:
                by_category[c][k] += g[k]
    measured = any(p.time_ns for p in points)
    sections = [
        ("Summary", _html_table(["", ""], [list(row) for row in _summary_rows(r)])),
        ("Roofline", _picture(plots.roofline_png, "roofline", points, r.roof) if points else ""),
        ("Top ops", _html_table(TOP_HEADER, _top_rows(r))),
        (
            "Ops by category",
            (_picture(plots.category_png, "categories", by_category, measured) if points else "")
            + _html_table(CATEGORY_HEADER, _category_rows(r)),
        ),
        (
            "Memory",
            (
                _picture(plots.memory_png, "memory", r.compiled_memory, r.live_by_origin)
                if r.compiled_memory or r.live_by_origin
                else ""
            )
            + _html_table(["what", "bytes"], _memory_rows(r)),
        ),
        (
            "Step timeline",
            (_picture(plots.step_timeline_png, "steps", r.steps) if r.steps else "")
            + _html_table(STEP_HEADER, _step_rows(r)),
        ),
    ]
    body = "".join(
        f'<h2 id="{name.lower().replace(" ", "-")}">{name}</h2>{content}'
        for name, content in sections
    )
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    source = f"<p>trace: <code>{html.escape(r.logdir)}</code></p>" if r.logdir else ""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(r.title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(r.title)}</h1>"
        f"<p>jaxstack xprof-lite, {stamp}</p>{source}{body}</body></html>"
    )


def report(
    fn,
    *args,
    out_dir: str | os.PathLike,
    runs: int = 3,
    peak: DevicePeak | None = None,
    named: dict | None = None,
    title: str | None = None,
    **kwargs,
) -> dict[str, Path]:
    """Compile `fn(*args)`, run it `runs` times under a trace, and write the report.

    The trace lands in `out_dir/trace` (openable by XProf/TensorBoard). Returns the paths of
    `report.html`, `report.md` and `report.json`.

    Example:
        paths = xprof_lite.report(train_step, state, batch, out_dir="/tmp/prof-report")
    """
    if runs < 1:
        raise Error(f"runs={runs}; run the function at least once to measure it")
    compiled = compile_fn(fn, *args, **kwargs)
    logdir = Path(out_dir) / "trace"
    jax.block_until_ready(compiled(*args, **kwargs))  # warm up outside the trace
    with trace(logdir) as cap:
        for step in range(runs):
            with step_annotation(step, "report"):
                jax.block_until_ready(compiled(*args, **kwargs))
    cap.save_hlo(compiled)
    data = cap.profile_data()
    profile = join_times(analyze_hlo(compiled.as_text()), tracefile.hlo_op_times(data))
    profile.memory = memory_analysis_dict(compiled)
    name = title or f"xprof-lite report: {getattr(fn, '__name__', profile.module)}"
    result = Report(
        title=name,
        peak=peak or device_peak(),
        profiles=[profile],
        compiled_memory=profile.memory or {},
        live_by_origin=live_bytes_by_origin(live_arrays(named)),
        steps=step_breakdown(data),
        step_peak_bytes=peak_memory_per_step(data),
        logdir=str(logdir),
    )
    return result.write(out_dir)


def report_logdir(
    logdir: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    peak: DevicePeak | None = None,
) -> dict[str, Path]:
    """Report on a captured trace (its newest run); per-op FLOPs and compiled memory where HLO
    was saved (`Capture.save_hlo`, `StepWindowProfiler.step(step, executable=...)`), measured
    times for everything. Writes into `out_dir` (default: logdir).

    The peak is `peak` if given, else the one recorded with the capture (the figure the traced
    run measured its MFU against), else this machine's `device_peak()`.

    `logdir` may also be a run directory or an `.xplane.pb` file; a file needs `out_dir` (the
    report never goes where the input file is).
    """
    if out_dir is None and Path(logdir).is_file():
        raise Error(
            f"{str(logdir)!r} is a file; pass the logdir given to xprof_lite.trace(logdir), "
            "or give --out DIR for the report"
        )
    data = tracefile.load_trace(logdir)
    profiles = profile_from_trace(data, saved_hlo_texts(logdir))
    if peak is None and (peak := saved_peak(logdir)) is not None:
        peak = dataclasses.replace(peak, source=f"{peak.source}, recorded with the capture")
    traced = {p.module for p in profiles}
    memory = {m: v for m, v in saved_memory(logdir).items() if m in traced}
    if len(memory) > 1:
        compiled_memory = {f"{m}: {k}": v for m, d in memory.items() for k, v in d.items()}
    else:
        compiled_memory = next(iter(memory.values()), {})
    result = Report(
        title=f"xprof-lite report: {Path(logdir).name}",
        peak=peak or device_peak(),
        profiles=profiles,
        compiled_memory=compiled_memory,
        steps=step_breakdown(data),
        step_peak_bytes=peak_memory_per_step(data),
        logdir=str(logdir),
    )
    return result.write(out_dir or logdir)
