import os
import signal

import numpy as np

from jaxstack.ckptlib import CheckpointManager, PreemptionHandler, resume


def test_sigterm_sets_the_flag_and_uninstall_restores_the_old_handler():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        handler = PreemptionHandler().install()
        assert not handler.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert handler.wait(5) and handler.requested
        assert handler.received_signal == signal.SIGTERM and seen == []
        handler.uninstall()
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
        handler.reset()
        assert not handler.requested
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_loop_saves_at_the_next_step_boundary_and_resume_continues(tmp_path):
    def run(start_state, steps, kill_at=None):
        with CheckpointManager(tmp_path, max_to_keep=2) as mgr, PreemptionHandler() as handler:
            restored = resume(mgr)
            state = restored.state if restored else start_state
            begin = restored.step + 1 if restored else 0
            for step in range(begin, steps):
                state = {"x": state["x"] + 1, "step": step}
                if step == kill_at:
                    os.kill(os.getpid(), signal.SIGTERM)
                if handler.requested:
                    mgr.save(step, state, data_state={"next": step + 1})
                    mgr.wait()
                    return state, "preempted"
            return state, "done"

    state, how = run({"x": np.zeros(3)}, 10, kill_at=4)
    assert how == "preempted" and state["step"] == 4
    final, how = run(None, 10)
    assert how == "done" and final["step"] == 9
    np.testing.assert_array_equal(final["x"], np.full(3, 10.0))  # same as an uninterrupted run


def test_resume_returns_none_when_there_is_nothing(tmp_path):
    with CheckpointManager(tmp_path) as mgr:
        assert resume(mgr) is None
