"""Memory: what a compiled function needs, what is alive now, and the per-step peak of a trace.

- `compiled_memory(fn, *args)`: XLA's buffer assignment (arguments, outputs, temporaries, code).
- `live_arrays(named=...)`: every live jax.Array with its size and origin: a `/`-joined path when
  it is a leaf of a PyTree you name (`{"params": params}`), else the Python line that created it
  (jax records it for jit outputs), else its shape.
- `peak_memory_per_step(trace)`: the allocator's peak inside each annotated step, when the trace
  has allocator events (GPU/TPU runtimes record `peak_bytes_in_use`; the CPU runtime does not).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax

from jaxstack.xprof_lite._src import tracefile
from jaxstack.xprof_lite._src.capture import compile_fn, memory_analysis_dict
from jaxstack.xprof_lite._src.steps import step_windows

MEMORY_STATS = ("peak_bytes_in_use", "bytes_in_use", "bytes_allocated")


def compiled_memory(fn, *args, **kwargs) -> dict[str, int]:
    """Argument/output/alias/temp/code bytes of `fn` compiled for `args`."""
    return memory_analysis_dict(compile_fn(fn, *args, **kwargs)) or {}


@dataclasses.dataclass(frozen=True)
class LiveArray:
    """One live device array from `live_arrays`: where it came from (its path in the `named`
    tree, else the line that created it), shape, dtype, size in bytes and devices."""

    origin: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    devices: str


def _path_str(path) -> str:
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _traceback_origin(array) -> str | None:
    tb = getattr(array, "traceback", None)
    if tb is None:
        return None
    try:
        frames = [f for f in tb.frames if "site-packages/jax" not in f.file_name]
    except AttributeError:
        return None
    if not frames:
        return None
    frame = frames[0]
    return f"{frame.file_name.rsplit('/', 1)[-1]}:{frame.line_num} ({frame.function_name})"


def live_arrays(named: dict | None = None, *, top: int | None = None) -> list[LiveArray]:
    """Live device arrays, largest first, each labelled with its origin."""
    names: dict[int, str] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(named or {})[0]:
        if isinstance(leaf, jax.Array):
            names[id(leaf)] = _path_str(path)
    out = []
    for array in jax.live_arrays():
        try:
            nbytes = int(array.nbytes)
            devices = ",".join(sorted(str(d) for d in array.devices()))
        except RuntimeError:  # deleted between listing and reading
            continue
        origin = names.get(id(array)) or _traceback_origin(array) or "unnamed"
        out.append(LiveArray(origin, tuple(array.shape), str(array.dtype), nbytes, devices))
    out.sort(key=lambda a: a.nbytes, reverse=True)
    return out[:top] if top else out


def live_bytes_by_origin(arrays: list[LiveArray]) -> dict[str, int]:
    """Bytes per origin, where PyTree paths are grouped by their first component."""
    totals: dict[str, int] = {}
    for a in arrays:
        key = a.origin.split("/", 1)[0]
        totals[key] = totals.get(key, 0) + a.nbytes
    return dict(sorted(totals.items(), key=lambda kv: kv[1], reverse=True))


def peak_memory_per_step(data) -> dict[int, int]:
    """Peak bytes in use per annotated step; empty when the trace has no allocator events."""
    data = tracefile.load_trace(data)
    samples = []
    for event in tracefile.events(data):
        for stat in MEMORY_STATS:
            if stat in event.stats:
                with contextlib.suppress(TypeError, ValueError):
                    samples.append((event.start_ns, int(event.stats[stat])))
                break
    if not samples:
        return {}
    peaks: dict[int, int] = {}
    for window in step_windows(data):
        inside = [b for t, b in samples if window.start_ns <= t <= window.end_ns]
        if inside:
            peaks[window.step] = max(peaks.get(window.step, 0), max(inside))
    return peaks
