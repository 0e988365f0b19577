"""The host CPU description and the host-allocator setting chosen from it."""

import json
import subprocess
import sys
import textwrap

import pytest

from jaxstack import xprof_lite
from jaxstack.xprof_lite._src.machine import ON_GLIBC, VECTOR_FLAGS

# Allocates, touches and frees a 64 MiB buffer from a worker thread (as XLA:CPU's threads do),
# six times, and prints the page faults of rounds 2-6 in units of the buffer's pages.
SCRIPT = textwrap.dedent(
    """
    import ctypes, resource, sys, threading
    from jaxstack.xprof_lite import set_host_allocator
    applied = set_host_allocator(sys.argv[1])
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


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
def test_retained_memory_is_reused_without_page_faults():
    applied, retained = _faults_per_page("retain")
    system_applied, system = _faults_per_page("system")
    assert (applied, system_applied) == ("retain", "system")
    # glibc's default mmaps the buffer afresh each round: about one fault per page.
    assert system > 0.5
    assert retained < 0.05


def test_auto_retains_host_memory_only_with_avx512():
    intel = xprof_lite.HostCPU("Intel(R) Xeon(R) Platinum", ("avx2", "fma", "avx512f"), 2)
    amd = xprof_lite.HostCPU("AMD EPYC", ("avx2", "fma"), 2)
    assert xprof_lite.choose_host_allocator(intel) == ("retain" if ON_GLIBC else "system")
    assert xprof_lite.choose_host_allocator(amd) == "system"


def test_host_cpu_reads_the_vector_flags():
    cpu = xprof_lite.host_cpu()
    assert cpu.cores >= 1 and cpu.model
    assert set(cpu.flags) <= set(VECTOR_FLAGS)


def test_unknown_allocator_mode_is_refused():
    with pytest.raises(xprof_lite.Error, match="'mmap' is not one of auto, retain, system"):
        xprof_lite.set_host_allocator("mmap")


# Drives a HostAllocatorTrial from a worker thread, with the page faults of a 64 MiB round as the
# "step time": the trial must really switch between mmapping the buffer afresh and keeping it.
TRIAL_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, resource, threading
    from jaxstack.xprof_lite import HostAllocatorTrial
    trial = HostAllocatorTrial(rounds=2, steps_per_block=2)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 20
    def run():
        libc.free(libc.malloc(100))  # the thread takes its arena before the trial starts
        while not trial.done:
            trial.before_step()
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            ptr = libc.malloc(size)
            ctypes.memset(ptr, 1, size)
            libc.free(ptr)
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
            trial.after_step(faults / (size / resource.getpagesize()))
    t = threading.Thread(target=run)
    t.start()
    t.join()
    print(json.dumps({"steps": trial.steps, "choice": trial.choice, "times": trial.step_times}))
    """
)


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
def test_trial_switches_the_allocator_at_run_time_and_keeps_the_faster():
    out = subprocess.run(
        [sys.executable, "-c", TRIAL_SCRIPT], check=True, capture_output=True, text=True
    ).stdout
    result = json.loads(out)
    assert result["steps"] == 12  # 2 rounds x 2 settings x (1 settling + 2 timed)
    # System mmaps the buffer afresh: about a fault per page each step; retain reuses it.
    assert all(f > 0.5 for f in result["times"]["system"]), result
    assert all(f < 0.05 for f in result["times"]["retain"]), result
    assert len(result["times"]["retain"]) == 4
    assert result["choice"] == "retain"


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
def test_trial_decides_by_median_so_one_slow_step_does_not_decide():
    trial = xprof_lite.HostAllocatorTrial(rounds=2, steps_per_block=2)
    # Each setting's timed steps in order; system has one step slowed by something else.
    times = {"system": iter([1.0, 9.0, 1.0, 1.0]), "retain": iter([1.5] * 4)}
    plan = ["system"] * 3 + ["retain"] * 3 + ["retain"] * 3 + ["system"] * 3
    for i, mode in enumerate(plan):
        assert not trial.done
        trial.before_step()
        settling = i % 3 == 0
        trial.after_step(100.0 if settling else next(times[mode]))
    assert trial.done and trial.choice == "system"
    assert trial.step_times == {"system": [1.0, 9.0, 1.0, 1.0], "retain": [1.5] * 4}


def test_setting_trial_alternates_blocks_and_applies_the_fastest():
    applied = []
    trial = xprof_lite.SettingTrial(
        ("a", "b", "c"), applied.append, rounds=2, steps_per_block=1, name="letter"
    )
    per_step = {"a": 3.0, "b": 1.0, "c": 2.0}
    ran = []
    while not trial.done:
        setting = trial.before_step()
        ran.append(setting)
        trial.after_step(per_step[setting])
    # Each round gives every setting a settling step and a timed one; round 2 runs backwards.
    assert ran == ["a", "a", "b", "b", "c", "c", "c", "c", "b", "b", "a", "a"]
    assert trial.steps == 12
    assert trial.choice == "b" and applied == [*ran, "b"]
    assert trial.step_times == {"a": [3.0, 3.0], "b": [1.0, 1.0], "c": [2.0, 2.0]}
    assert trial.before_step() == "b" and applied[-1] == "b"
    assert trial.describe() == "letter: b (median step: a 3.000s, b 1.000s, c 2.000s)"


def test_setting_trial_needs_distinct_settings():
    with pytest.raises(xprof_lite.Error, match="two or more distinct settings"):
        xprof_lite.SettingTrial(("a", "a"))


def test_setting_trial_drops_a_ruinous_setting_after_one_step():
    trial = xprof_lite.SettingTrial(("fast", "ruinous"), rounds=2, steps_per_block=2, give_up=20)
    per_step = {"fast": 1.0, "ruinous": 200.0}
    ran = []
    while not trial.done:
        setting = trial.before_step()
        ran.append(setting)
        trial.after_step(per_step[setting])
    # fast's first block gives a median; ruinous's settling step is then 200x it (over the
    # 20x limit), so its other five steps are never run.
    assert ran == ["fast"] * 3 + ["ruinous"] + ["fast"] * 3
    assert trial.choice == "fast" and trial.dropped == {"ruinous": 200.0}
    assert trial.describe() == (
        "setting: fast (median step: fast 1.000s; ruinous dropped after a 200.0s step)"
    )


def test_setting_trial_keeps_a_setting_that_is_only_slower():
    trial = xprof_lite.SettingTrial(("a", "b"), rounds=2, steps_per_block=2, give_up=20)
    while not trial.done:
        trial.after_step({"a": 1.0, "b": 15.0}[trial.before_step()])
    assert trial.steps == 12 and trial.dropped == {} and trial.choice == "a"
