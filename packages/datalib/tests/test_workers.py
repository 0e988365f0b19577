"""Worker processes never outlive the program that started them, however it ends."""

import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import time
import jaxstack.datalib as dl
if __name__ == "__main__":
    docs = dl.InMemorySource([f"document {i} " * 20 for i in range(64)])
    it = dl.lm_batches(docs, seq_len=32, batch_size=2, num_workers=2)
    next(it)
    print("reading", flush=True)
    time.sleep(600)
"""


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":  # a zombie has exited already
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(pid)
        except OSError:
            pass
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(300)
def test_workers_exit_when_the_program_is_killed(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "reading"
        workers = descendants(proc.pid)
        assert len(workers) >= 2  # two workers (and multiprocessing's resource tracker)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(workers) == set()
    finally:
        proc.kill()
        for pid in alive(descendants(proc.pid) | locals().get("workers", set())):
            os.kill(pid, signal.SIGKILL)
