"""Running the stack's console scripts the way a user does: as processes, from the venv.

A stage whose command is not installed is skipped with the name of the package that provides it,
so the scenario grows as packages land and never pretends a missing piece works.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
TIMEOUT_S = 300


def command(name: str, package: str) -> str:
    """Path of console script `name`; skips the test when `package` does not provide it yet."""
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{package} provides no `{name}` command yet (jaxstack-{package} not landed)")
    return str(path)


def environment(**extra: str) -> dict[str, str]:
    """The test's environment for a child process, on the backend under test."""
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", os.environ.get("JAXSTACK_TEST_BACKEND", "cpu"))
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a command to completion; its output is shown when it fails."""
    result = subprocess.run(
        args, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"{' '.join(args)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )
    return result


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, what: str, process: subprocess.Popen, timeout: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"exited ({process.returncode}) before {what}:\n{output[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def http_ok(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200
    return False


@contextlib.contextmanager
def server(args: list[str], ready_path: str, cwd: Path, attempts: int = 3) -> Iterator[str]:
    """Start a server on a free port (`{port}` in `args`), yield its base URL once `ready_path`
    answers 200, then stop it with SIGTERM. Another process taking the port between the probe and
    the bind is retried with a new port."""
    for attempt in range(attempts):
        port = free_port()
        process = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in args],
            cwd=cwd,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(functools.partial(http_ok, base + ready_path), base + ready_path, process)
        except AssertionError as error:
            process.kill()
            process.wait()
            if "address already in use" in str(error).lower() and attempt + 1 < attempts:
                continue
            raise
        try:
            yield base
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return
