"""Capture steps N..M of a long-running loop, on a schedule or on request.

A trainer wraps each step in `profiler.step(step)`. That always adds the step annotation (nearly
free when no trace runs) and starts/stops a trace at the window's edges. Requests for a capture
come from the config (`start_step`), from code (`request()`), from `kill -USR2 <pid>`
(`install_signal_handler()`) or from `curl 127.0.0.1:<port>/profile?steps=5` (`serve_http()`).
The signal handler and HTTP thread only set a flag; the trace starts at the next step boundary
on the loop's own thread, so a capture always holds whole steps.

A report of the capture (`jaxstack-prof report LOGDIR`) counts each op's FLOPs and bytes from
the optimised HLO of what the steps run: `profiler.step(step, executable=compiled_step)` saves
it (and the compiled memory analysis) when a capture starts, outside the traced steps. The
device peak the run measures MFU against is recorded too, so the report's roofline and the
run's MFU use one figure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from jaxstack.xprof_lite._src.annotate import step_annotation
from jaxstack.xprof_lite._src.capture import Capture, save_hlo, save_peak, trace
from jaxstack.xprof_lite._src.errors import Error

MAX_STEPS_PER_CAPTURE = 1000


class StepWindowProfiler:
    """Trace `num_steps` steps from `start_step` on (and again whenever a capture is requested).

    Example:
        profiler = StepWindowProfiler("/tmp/prof", start_step=10, num_steps=3)
        profiler.install_signal_handler()      # kill -USR2 <pid> captures the next 3 steps
        step_fn = jax.jit(train_step).lower(state, batch).compile()
        for step in range(100):
            with profiler.step(step, executable=step_fn):   # its HLO: FLOPs in the report
                state = step_fn(state, batch)
        profiler.close()
        print([c.run_dir for c in profiler.captures])
    """

    def __init__(
        self,
        logdir: str | os.PathLike,
        *,
        start_step: int | None = None,
        num_steps: int = 3,
        name: str = "train",
        python_tracer: bool = False,
        peak=None,
    ):
        if not 1 <= num_steps <= MAX_STEPS_PER_CAPTURE:
            raise Error(
                f"num_steps={num_steps} is out of range; capture 1..{MAX_STEPS_PER_CAPTURE} steps"
            )
        self.logdir = Path(logdir)
        self.start_step = start_step
        self.num_steps = num_steps
        self.name = name
        self.python_tracer = python_tracer
        # The DevicePeak to record with the captures (None: the one this process uses).
        self.peak = peak
        self.captures: list[Capture] = []
        self._saved_executables: set[int] = set()
        self._lock = threading.Lock()
        self._requested: int | None = None
        self._stop_after: int | None = None
        self._stack: contextlib.ExitStack | None = None
        self._current: Capture | None = None
        self._server: ThreadingHTTPServer | None = None
        self._previous_handler = None
        self._signum: int | None = None

    CONFIG_KEYS = ("logdir", "start_step", "num_steps", "name", "python_tracer", "signal",
                   "http_port")  # fmt: skip

    @classmethod
    def from_config(cls, config: dict) -> StepWindowProfiler:
        """Build from a trainer's config section, installing the triggers it asks for.

        Keys: `logdir` (required), `start_step`, `num_steps`, `name`, `python_tracer`,
        `signal` (True for SIGUSR2, or a signal number), `http_port` (0 picks a free port).

        Example:
            profiler = StepWindowProfiler.from_config(
                {"logdir": "/tmp/prof", "start_step": 100, "num_steps": 3, "signal": True}
            )
        """
        unknown = set(config) - set(cls.CONFIG_KEYS)
        if unknown:
            raise Error(f"unknown profiler config keys {sorted(unknown)}; use {cls.CONFIG_KEYS}")
        if "logdir" not in config:
            raise Error("profiler config needs 'logdir' (where captures are written)")
        kwargs = {k: config[k] for k in ("start_step", "num_steps", "name", "python_tracer")
                  if k in config}  # fmt: skip
        profiler = cls(config["logdir"], **kwargs)
        if config.get("signal"):
            sig = config["signal"]
            profiler.install_signal_handler(signal.SIGUSR2 if sig is True else int(sig))
        if config.get("http_port") is not None:
            profiler.serve_http(int(config["http_port"]))
        return profiler

    @property
    def active(self) -> bool:
        return self._stack is not None

    @property
    def pending(self) -> bool:
        return self._requested is not None

    def request(self, num_steps: int | None = None) -> bool:
        """Ask for a capture of the next `num_steps` steps; False if one is queued or running."""
        steps = self.num_steps if num_steps is None else int(num_steps)
        if not 1 <= steps <= MAX_STEPS_PER_CAPTURE:
            raise Error(f"num_steps={steps} is out of range; ask for 1..{MAX_STEPS_PER_CAPTURE}")
        with self._lock:
            if self._requested is not None or self.active:
                return False
            self._requested = steps
            return True

    def step(self, step: int, executable=None) -> _Step:
        """Wrap one step: starts or stops the trace at the window's edges, annotates the step.

        `executable` (a `jax.stages.Compiled`, or None) is what the step runs: when a capture
        starts, its optimised HLO is saved first (once per executable), so the report has its
        FLOPs, bytes, roofline and compiled memory.

        A plain class rather than a generator context manager: this runs every step of every
        run, so it stays at one step annotation plus a few attribute reads when nothing is traced.
        """
        return _Step(self, step, executable)

    def _before(self, step: int, executable=None) -> None:
        if self._stack is not None:
            return
        steps = None
        if step == self.start_step:
            steps = self.num_steps
        if self._requested is not None:
            with self._lock:
                if self._requested is not None:
                    steps, self._requested = self._requested, None
        if steps is None:
            return
        self._record(executable)
        self._stack = contextlib.ExitStack()
        self._current = self._stack.enter_context(
            trace(self.logdir, python_tracer=self.python_tracer)
        )
        self._stop_after = step + steps - 1

    def _record(self, executable) -> None:
        """Before a capture: the peak it is to be read against and the HLO of what it runs."""
        if (peak := self.peak or _peak_in_use()) is not None:
            save_peak(self.logdir, peak)
        if executable is not None and id(executable) not in self._saved_executables:
            save_hlo(self.logdir, executable)
            self._saved_executables.add(id(executable))

    def _stop(self) -> None:
        stack, self._stack, self._stop_after = self._stack, None, None
        if stack is not None:
            stack.close()
            self.captures.append(self._current)
            self._current = None

    def install_signal_handler(self, signum: int = signal.SIGUSR2) -> None:
        """`kill -<signum> <pid>` requests a capture of the next `num_steps` steps."""
        if threading.current_thread() is not threading.main_thread():
            raise Error("install_signal_handler() must be called from the main thread")
        self._previous_handler = signal.signal(signum, lambda *_: self.request())
        self._signum = signum

    def serve_http(self, port: int = 0, host: str = "127.0.0.1") -> int:
        """Serve `GET /profile?steps=N` and `GET /status` on loopback; returns the port.

        Only loopback addresses are accepted: a profiler trigger is not for the network.
        """
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise Error(f"host={host!r} is not a loopback address; use 127.0.0.1")
        if self._server is not None:
            return self._server.server_address[1]
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self._server.server_address[1]

    def status(self) -> dict:
        return {
            "logdir": str(self.logdir),
            "active": self.active,
            "pending": self.pending,
            "captures": [str(c.run_dir) for c in self.captures],
        }

    def close(self) -> None:
        """Stop a running capture, the HTTP trigger and the signal handler."""
        self._stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._signum is not None:
            signal.signal(self._signum, self._previous_handler or signal.SIG_DFL)
            self._signum = None

    def __enter__(self) -> StepWindowProfiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Step:
    __slots__ = ("_annotation", "_executable", "_profiler", "_step")

    def __init__(self, profiler: StepWindowProfiler, step: int, executable=None):
        self._profiler = profiler
        self._step = step
        self._executable = executable
        self._annotation = None

    def __enter__(self) -> None:
        self._profiler._before(self._step, self._executable)
        self._annotation = step_annotation(self._step, self._profiler.name)
        self._annotation.__enter__()

    def __exit__(self, *exc) -> None:
        self._annotation.__exit__(*exc)
        stop_after = self._profiler._stop_after
        if stop_after is not None and self._step >= stop_after:
            self._profiler._stop()


def _handler_for(profiler: StepWindowProfiler) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path == "/status":
                self._reply(200, profiler.status())
            elif url.path == "/profile":
                try:
                    steps = int(parse_qs(url.query).get("steps", [profiler.num_steps])[0])
                    accepted = profiler.request(steps)
                except (Error, ValueError) as exc:
                    self._reply(400, {"error": str(exc)})
                    return
                if accepted:
                    self._reply(202, {"requested_steps": steps, **profiler.status()})
                else:
                    self._reply(409, {"error": "a capture is already pending or running"})
            else:
                self._reply(404, {"error": f"unknown path {url.path!r}; use /profile or /status"})

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # keep the training log clean
            pass

    return Handler


def _peak_in_use():
    """The device peak this machine's runs use now, without measuring: the spec table's row for
    an accelerator, else the measured CPU peak in the cache (the figure a trainer's
    `device_peak()` call returned, since that call leaves it there); None if none is cached."""
    import jax

    from jaxstack.xprof_lite._src.peak import DevicePeak, _cache_key, cache_dir, spec_peak

    device = jax.devices()[0]
    if device.platform != "cpu":
        return spec_peak(device.device_kind)
    try:
        path = cache_dir() / f"peak-{_cache_key(device)}.json"
        return DevicePeak.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
