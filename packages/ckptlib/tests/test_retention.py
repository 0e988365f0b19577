import pytest

from jaxstack.ckptlib import CheckpointManager
from jaxstack.ckptlib._src.retention import RetentionPolicy, steps_to_keep


def test_last_n_every_k_and_best_n_are_a_union():
    steps = list(range(10, 110, 10))
    metrics = {s: {"loss": abs(s - 40) / 10} for s in steps}  # best at 40, then 30/50
    policy = RetentionPolicy(max_to_keep=2, keep_every_n_steps=50, best_n=3, best_metric="loss")
    assert steps_to_keep(steps, metrics, policy) == {90, 100, 50, 40, 30}


def test_max_mode_and_steps_without_the_metric():
    metrics = {1: {"acc": 0.5}, 2: {}, 3: {"acc": 0.9}, 4: {"acc": float("nan")}, 5: {}}
    policy = RetentionPolicy(best_n=1, best_metric="acc", best_mode="max")
    assert steps_to_keep([1, 2, 3, 4, 5], metrics, policy) == {3, 5}  # 5: the newest


def test_no_limits_keep_everything_and_newest_is_always_kept():
    assert steps_to_keep([1, 2, 3], {}, RetentionPolicy()) == {1, 2, 3}
    assert steps_to_keep([1, 2, 3], {}, RetentionPolicy(keep_every_n_steps=2)) == {1, 2, 3}
    policy = RetentionPolicy(best_n=1, best_metric="loss")
    assert steps_to_keep([7], {7: {}}, policy) == {7}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_to_keep": 0}, "max_to_keep=0"),
        ({"best_n": 2}, "needs best_metric"),
        ({"best_n": 1, "best_metric": "l", "best_mode": "low"}, "best_mode='low'"),
    ],
)
def test_bad_policies_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RetentionPolicy(**kwargs)


def test_manager_applies_retention_after_each_commit(tmp_path, state):
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 7.0}
    with CheckpointManager(
        tmp_path, max_to_keep=2, keep_every_n_steps=3, best_n=1, best_metric="loss"
    ) as mgr:
        for step, loss in losses.items():
            mgr.save(step, state, metrics={"loss": loss})
        mgr.wait()
        assert mgr.all_steps() == [2, 3, 5, 6]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step_0000000{s}" for s in (2, 3, 5, 6)]


def test_a_damaged_newest_step_never_costs_the_only_good_one(tmp_path, state):
    with CheckpointManager(tmp_path, max_to_keep=1) as mgr:
        mgr.save(1, state)
        mgr.wait()
        mgr._before_commit_hook = lambda step: truncate_largest(
            tmp_path / f".tmp-step_0000000{step}"
        )
        mgr.save(2, state)  # commits, but one of its files is cut short afterwards
        mgr.wait()
        assert mgr.all_steps() == [1]
        mgr._before_commit_hook = None
        mgr.save(3, state)
        mgr.wait()
        assert mgr.all_steps() == [3]


def truncate_largest(root):
    files = [p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json"]
    victim = max(files, key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[:-1])
