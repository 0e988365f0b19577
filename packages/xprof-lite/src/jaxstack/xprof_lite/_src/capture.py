"""Capture: `with trace(logdir):` around jax.profiler, plus the files a person opens afterwards.

The logdir keeps XProf's layout (`plugins/profile/<run>/<host>.xplane.pb`), so TensorBoard or
XProf open it unchanged. Next to it we write a plain Chrome-trace JSON (`trace.json`, the format
chrome://tracing and ui.perfetto.dev open offline) and, on request, the optimised HLO text of the
functions that ran, so `jaxstack-prof report LOGDIR` can count each op's FLOPs later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import itertools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import jax
from jax.profiler import ProfileData

from jaxstack.xprof_lite._src import tracefile
from jaxstack.xprof_lite._src.errors import Error
from jaxstack.xprof_lite._src.files import write_text_atomically

HLO_SUBDIR = "xprof_lite_hlo"
PEAK_FILE = "peak.json"


def profiler_options(*, python_tracer: bool = False, host_tracer_level: int = 2):
    """jax.profiler options; the Python tracer is off by default: it records every Python call
    and costs far more than the 5% overhead budget of a training step."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 1 if python_tracer else 0
    options.host_tracer_level = host_tracer_level
    return options


@dataclasses.dataclass
class Capture:
    """What one `trace(logdir)` wrote; filled in when the block exits."""

    logdir: Path
    run_dir: Path | None = None
    xplane_path: Path | None = None
    chrome_trace_path: Path | None = None
    perfetto_trace_path: Path | None = None

    def profile_data(self) -> ProfileData:
        if self.xplane_path is None:
            raise Error("the trace is still running; read it after the `with trace(...)` block")
        return ProfileData.from_file(str(self.xplane_path))

    def save_hlo(self, fn, *args, **kwargs) -> Path:
        """Store the optimised HLO of `fn(*args)` in the logdir (for per-op FLOPs in reports).

        `fn` may be a function, a `jax.jit` object or an already compiled `jax.stages.Compiled`.
        """
        return save_hlo(self.logdir, fn, *args, **kwargs)


def compile_fn(fn, *args, **kwargs):
    """A `jax.stages.Compiled` for `fn` at these arguments (compiled once, reused after)."""
    if isinstance(fn, jax.stages.Compiled):
        return fn
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        return jitted.lower(*args, **kwargs).compile()
    except TypeError as exc:
        raise Error(
            f"could not compile {getattr(fn, '__name__', fn)!r} at the given arguments ({exc}); "
            "pass jax.jit(fn, static_argnums=...) for non-array arguments"
        ) from exc


def save_hlo(logdir: str | os.PathLike, fn, *args, **kwargs) -> Path:
    """Compile `fn` at these arguments and save its optimised HLO text under `logdir`, with
    its compiled memory analysis beside it.

    The report reads them back to give each traced op its shapes, FLOPs and bytes (the roofline
    and the op profile's FLOP columns) and the module's argument, output and temporary bytes;
    without them, only measured times are shown.

    Args:
      logdir: the capture's log directory (the files go in its `xprof_lite_hlo/`).
      fn: a function, a jitted function or a `jax.stages.Compiled`.
      *args, **kwargs: example arguments to compile `fn` at.

    Returns:
      The path of the written `<module>.hlo.txt` (written atomically).
    """
    compiled = compile_fn(fn, *args, **kwargs)
    text = compiled.as_text()
    name = text.split(None, 2)[1].rstrip(",") if text.startswith("HloModule") else "module"
    target = Path(logdir) / HLO_SUBDIR / f"{name}.hlo.txt"
    write_text_atomically(target, text)
    if (memory := memory_analysis_dict(compiled)) is not None:
        write_text_atomically(target.with_name(f"{name}.memory.json"), json.dumps(memory, indent=1))
    return target


def memory_analysis_dict(compiled) -> dict | None:
    """Argument/output/alias/temp/generated-code bytes of a compiled function."""
    try:
        stats = compiled.memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    fields = {
        "argument_bytes": "argument_size_in_bytes",
        "output_bytes": "output_size_in_bytes",
        "alias_bytes": "alias_size_in_bytes",
        "temp_bytes": "temp_size_in_bytes",
        "code_bytes": "generated_code_size_in_bytes",
        "host_temp_bytes": "host_temp_size_in_bytes",
    }
    return {k: int(getattr(stats, v, 0) or 0) for k, v in fields.items()}


def saved_hlo_texts(logdir: str | os.PathLike) -> list[str]:
    folder = Path(logdir) / HLO_SUBDIR
    return [p.read_text() for p in sorted(folder.glob("*.hlo.txt"))] if folder.is_dir() else []


def saved_hlo_modules(logdir: str | os.PathLike) -> set[str]:
    """The names of the modules whose HLO `save_hlo` stored under `logdir`."""
    folder = Path(logdir) / HLO_SUBDIR
    return {p.name.removesuffix(".hlo.txt") for p in folder.glob("*.hlo.txt")}


def saved_memory(logdir: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Module name -> the compiled memory analysis `save_hlo` stored next to its HLO."""
    folder = Path(logdir) / HLO_SUBDIR
    if not folder.is_dir():
        return {}
    return {
        p.name.removesuffix(".memory.json"): json.loads(p.read_text())
        for p in sorted(folder.glob("*.memory.json"))
    }


def save_peak(logdir: str | os.PathLike, peak) -> Path:
    """Record the device peak a capture is to be read against (a `DevicePeak`), so that its
    report later shows the very figure the run used for MFU, not one measured again."""
    target = Path(logdir) / HLO_SUBDIR / PEAK_FILE
    write_text_atomically(target, json.dumps(peak.to_dict(), indent=1))
    return target


def saved_peak(logdir: str | os.PathLike):
    """The `DevicePeak` that `save_peak` recorded under `logdir`, or None."""
    from jaxstack.xprof_lite._src.peak import DevicePeak

    path = Path(logdir) / HLO_SUBDIR / PEAK_FILE
    try:
        return DevicePeak.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def export_chrome_trace(run_dir: Path, target: Path | None = None) -> Path | None:
    """Uncompress jax's `<host>.trace.json.gz` (Chrome trace format) to a plain JSON file."""
    sources = sorted(run_dir.glob("*.trace.json.gz")) or sorted(run_dir.glob("*.json.gz"))
    if not sources:
        return None
    target = target or run_dir / "trace.json"
    tmp = target.with_suffix(".tmp")
    with gzip.open(sources[0], "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.replace(target)
    return target


def _unique_run_name(run_dir: Path) -> Path:
    """jax names a run after the second it ended, so a second capture in the same second would
    overwrite the first; give each finished run its own name (still a run to XProf)."""
    target = run_dir.with_name(f"{run_dir.name}_{os.getpid()}_{next(_RUN_COUNTER)}")
    run_dir.rename(target)
    return target


_RUN_COUNTER = itertools.count()


@contextlib.contextmanager
def trace(
    logdir: str | os.PathLike,
    *,
    perfetto: bool = True,
    python_tracer: bool = False,
    host_tracer_level: int = 2,
) -> Iterator[Capture]:
    """Profile the block into `logdir`; yields a `Capture` whose paths are set on exit.

    Example:
        with xprof_lite.trace("/tmp/prof") as cap:
            for step in range(3):
                with xprof_lite.step_annotation(step):
                    state = train_step(state, batch)
        print(cap.chrome_trace_path)  # open in ui.perfetto.dev
    """
    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(tracefile.run_dirs(logdir))
    capture = Capture(logdir)
    options = profiler_options(python_tracer=python_tracer, host_tracer_level=host_tracer_level)
    try:
        jax.profiler.start_trace(
            str(logdir), create_perfetto_trace=perfetto, profiler_options=options
        )
    except RuntimeError as exc:
        raise Error(
            f"could not start a trace into {str(logdir)!r}: {exc}; only one trace may run at a "
            "time, so stop the other one (or its StepWindowProfiler) first"
        ) from exc
    try:
        yield capture
    finally:
        jax.profiler.stop_trace()
        new = [d for d in tracefile.run_dirs(logdir) if d not in before]
        if new:
            capture.run_dir = _unique_run_name(new[-1])
            capture.xplane_path = tracefile.find_xplane(capture.run_dir)
            capture.chrome_trace_path = export_chrome_trace(capture.run_dir)
            perfetto_file = capture.run_dir / "perfetto_trace.json.gz"
            capture.perfetto_trace_path = perfetto_file if perfetto_file.exists() else None
