"""The retained host allocator: a large buffer freed and allocated again is not faulted in again."""

import subprocess
import sys
import textwrap

import pytest

from jaxstack.trainer._src.config import load_config
from jaxstack.trainer._src.errors import ConfigError
from jaxstack.trainer._src.host_memory import ON_GLIBC

pytestmark = pytest.mark.skipif(not ON_GLIBC, reason="glibc only")

# Allocates, touches and frees a 64 MiB buffer from a worker thread (as XLA:CPU's threads do),
# six times, and prints the page faults of rounds 2-6 in units of the buffer's pages.
SCRIPT = textwrap.dedent(
    """
    import ctypes, resource, sys, threading
    from jaxstack.trainer._src.host_memory import retain_freed_host_memory
    applied = retain_freed_host_memory() if sys.argv[1] == "retain" else None
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 20
    def one_round():
        ptr = libc.malloc(size)
        ctypes.memset(ptr, 1, size)
        libc.free(ptr)
    def run():
        one_round()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            one_round()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        print(applied, faults / (5 * size / resource.getpagesize()))
    t = threading.Thread(target=run)
    t.start()
    t.join()
    """
)


def _faults_per_page(mode: str) -> tuple[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], check=True, capture_output=True, text=True
    ).stdout.split()
    return out[0], float(out[1])


def test_retained_memory_is_reused_without_page_faults():
    applied, retained = _faults_per_page("retain")
    _, system = _faults_per_page("system")
    assert applied == "True"
    # glibc's default mmaps the buffer afresh each round: about one fault per page.
    assert system > 0.5
    assert retained < 0.05


def test_host_allocator_setting_is_validated():
    assert load_config("tiny", []).train.host_allocator == "retain"
    with pytest.raises(ConfigError, match=r"train\.host_allocator must be retain or system"):
        load_config("tiny", ["train.host_allocator=mmap"])
