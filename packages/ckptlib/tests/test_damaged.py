"""A damaged checkpoint never causes a crash loop: it is moved aside (kept for inspection) and
the run says so, so resuming and saving that step again just works."""

import numpy as np
import pytest
from ckptlib_testutil import assert_trees_equal, make_state
from test_integrity import flip_a_byte

from jaxstack.ckptlib import (
    CheckpointDamagedWarning,
    CheckpointFallbackWarning,
    CheckpointManager,
)


def save_steps(root, steps):
    with CheckpointManager(root, async_save=False) as mgr:
        for step in steps:
            mgr.save(step, make_state(step), data_state={"step": step})


def truncate(step_dir):
    victim = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=_size)
    victim.write_bytes(victim.read_bytes()[:-3])
    return victim


def _size(path):
    return path.stat().st_size


def test_resume_past_a_bit_flipped_step_then_saving_that_step_again_works(tmp_path):
    save_steps(tmp_path, [10, 20])
    victim = flip_a_byte(tmp_path / "step_00000020")
    flipped = victim.read_bytes()
    mgr = CheckpointManager(tmp_path, async_save=False)
    with pytest.warns(CheckpointFallbackWarning, match=r"step_00000020.*moved to .*damaged"):
        restored = mgr.restore()
    assert restored.step == 10
    [aside] = mgr.damaged
    assert aside.step == 20 and aside.moved_to.parent == tmp_path / "damaged"
    assert "sha256" in " ".join(aside.problems)
    # Kept for inspection, byte for byte.
    assert (aside.moved_to / victim.relative_to(tmp_path / "step_00000020")).read_bytes() == flipped
    # The run goes on and reaches step 20 again: no CheckpointExistsError, on any rerun.
    mgr.save(20, make_state(21))
    assert mgr.latest_step() == 20 and mgr.verify(20).ok
    assert_trees_equal(mgr.restore(20).state, make_state(21))
    mgr.close()


def test_every_step_truncated_is_reported_loudly_and_moved_aside(tmp_path):
    save_steps(tmp_path, [10, 20])
    for step_dir in ("step_00000010", "step_00000020"):
        truncate(tmp_path / step_dir)
    with pytest.warns(CheckpointDamagedWarning) as record:
        mgr = CheckpointManager(tmp_path, async_save=False)
    message = str(record[0].message)
    assert "no good checkpoint is left" in message and "starts from scratch" in message
    assert "step 10" in message and "step 20" in message and str(tmp_path / "damaged") in message
    assert [d.step for d in mgr.damaged] == [10, 20]
    assert mgr.latest_step() is None
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "damaged").iterdir()) == [
        "step_00000010",
        "step_00000020",
    ]
    mgr.save(10, make_state(3))  # training from scratch reaches step 10 again
    assert mgr.all_steps() == [10]
    mgr.close()


def test_a_read_only_manager_moves_nothing(tmp_path):
    save_steps(tmp_path, [10])
    truncate(tmp_path / "step_00000010")
    mgr = CheckpointManager(tmp_path, read_only=True)
    assert mgr.latest_step() is None and mgr.damaged == []
    assert (tmp_path / "step_00000010").is_dir() and not (tmp_path / "damaged").exists()


def test_saving_over_a_step_known_to_be_damaged_moves_it_aside(tmp_path):
    save_steps(tmp_path, [10])
    flip_a_byte(tmp_path / "step_00000010")
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        assert not mgr.verify(10).ok
        mgr.save(10, {"w": np.ones(3, np.float32)})
        assert mgr.verify(10).ok and [d.step for d in mgr.damaged] == [10]
