"""A run applies `train.host_allocator`: with "retain", freed host memory is reused, not
paged back in from the kernel on every step."""

import json
import platform
import subprocess
import sys

import pytest

from jaxstack import rl

# In a fresh process (glibc's malloc untouched, 4 KiB pages): page faults of allocating,
# filling and freeing 64 MiB three times, then the same after a 2-step SFT run.
SCRIPT = """
import ctypes, json, resource, sys
import numpy as np

# 4 KiB pages only (no transparent huge pages), so that faults count the pages touched
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE

def faults():
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        block = np.ones(1 << 23)  # 64 MiB, above glibc's largest mmap threshold
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

before = faults()
from jaxstack import rl
result = rl.sft(rl.load_config("sft", "tiny-sft", sys.argv[1:]))
print(json.dumps({"before": before, "after": faults(), "summary": result.summary}))
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the allocator settings are glibc's",
)
def test_a_run_with_retain_keeps_freed_memory_for_the_next_allocation(tmp_path, tiny):
    overrides = [
        *tiny,
        "train.steps=2",
        "train.host_allocator=retain",
        "checkpoint.enabled=false",
        f"log.run_dir={tmp_path / 'run'}",
    ]
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, *overrides],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # glibc's own rule maps each 64 MiB block afresh: 16,384 zeroed pages faulted in, 3 times
    assert result["before"] > 40_000
    # retained: the heap grows once (at most one block's pages), then the same pages serve
    assert result["after"] < 20_000
    assert result["summary"]["host_allocator"] == "retain"


def test_system_leaves_malloc_alone_and_says_so(tmp_path, tiny):
    config = rl.load_config(
        "sft",
        "tiny-sft",
        [
            *tiny,
            "train.steps=1",
            "train.host_allocator=system",
            "checkpoint.enabled=false",
            f"log.run_dir={tmp_path}",
        ],
    )
    assert rl.sft(config).summary["host_allocator"] == "system"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["host_allocator"] for r in records if r["kind"] == "summary"] == ["system"]
