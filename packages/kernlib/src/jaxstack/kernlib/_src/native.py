"""kernlib's C++ kernels, built for the CPU they run on at first use.

The XLA FFI kernels for CPU (`ops/<op>/ffi_cpu.cc`) ship as source. They are compiled here with
the system's C++ compiler (`$CXX`, else `c++`) for this CPU (`-march=native`), as PyTorch
Inductor builds its CPU kernels: one binary for every x86 machine would be built for the
oldest vector extension and be slow on the rest. The shared library is cached in kernlib's
cache directory (`tuning.cache_dir()`), keyed by the source, jaxlib's FFI headers, the
compiler and the CPU's flags, and written atomically; a process builds or loads it once.
When it cannot be built (no compiler, a failed build) `library` returns the reason, and
dispatch falls back to the XLA implementation with that reason in its one-time log line.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

from jaxstack.kernlib._src import tuning

FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp-simd", "-w")
TUNE_FOR_THIS_CPU = ("-march=native",)  # dropped when the compiler refuses it


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), else its name: part of the key of a -march=native build."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def compiler() -> list[str] | str:
    """The C++ compiler's command line, or why there is none."""
    command = shlex.split(os.environ.get("CXX", "c++"))
    if not command or shutil.which(command[0]) is None:
        return (
            f"no C++ compiler {command[0] if command else '(empty $CXX)'!r} on PATH; install "
            f"one (apt install g++) or point $CXX at it"
        )
    return command


@functools.cache
def library(source: Path) -> ctypes.CDLL | str:
    """`source` built and loaded, or why it could not be (the reason is kept: one try a process)."""
    cxx = compiler()
    if isinstance(cxx, str):
        return cxx
    include = Path(jax.ffi.include_dir())
    version = subprocess.run([*cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256()
    for part in (source.read_bytes(), *(h.read_bytes() for h in sorted(include.rglob("*.h")))):
        key.update(part)
    key.update("\0".join([version, *cxx, *FLAGS, cpu_flags()]).encode())
    target = tuning.cache_dir() / "native" / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        reason = _build(cxx, source, include, target)
        if reason:
            return reason
    return ctypes.CDLL(str(target))


def _build(cxx: list[str], source: Path, include: Path, target: Path) -> str | None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        for tuned in (TUNE_FOR_THIS_CPU, ()):
            command = [*cxx, *FLAGS, *tuned, f"-I{include}", str(source), "-o", partial]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode == 0:
                os.replace(partial, target)  # atomic: a reader sees no file or a whole one
                return None
        return f"building {source.name} failed: {shlex.join(command)}: {done.stderr[-2000:]}"
    finally:
        if os.path.exists(partial):
            os.remove(partial)
