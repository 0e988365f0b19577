"""Schedule values against their closed forms."""

import math

import numpy as np
import pytest

from jaxstack.optlib import ConfigError, OptimizerConfig, ScheduleConfig, build_schedule


def values(schedule, steps):
    return np.array([float(schedule(s)) for s in steps])


def test_constant_with_and_without_warmup():
    np.testing.assert_allclose(values(build_schedule(ScheduleConfig(), 2.0), range(5)), 2.0)
    got = values(build_schedule(ScheduleConfig("constant", warmup_steps=4), 2.0), range(7))
    np.testing.assert_allclose(got, [0, 0.5, 1, 1.5, 2, 2, 2], rtol=1e-6)


def test_warmup_ratio_is_a_share_of_total_steps():
    by_ratio = ScheduleConfig("warmup_linear", total_steps=30, warmup_ratio=0.25, warmup_steps=3)
    assert by_ratio.warmup == 7  # the ratio replaces warmup_steps
    by_steps = by_ratio.replace(warmup_ratio=None, warmup_steps=7)
    steps = range(0, 35, 3)
    np.testing.assert_array_equal(
        values(build_schedule(by_ratio, 1.0), steps), values(build_schedule(by_steps, 1.0), steps)
    )
    with pytest.raises(ConfigError, match="warmup_ratio needs total_steps"):
        ScheduleConfig.from_dict({"warmup_ratio": 0.1})
    with pytest.raises(ConfigError, match=r"^warmup_ratio: Input should be less than 1, got 1\.5"):
        ScheduleConfig.from_dict({"warmup_ratio": 1.5, "total_steps": 10})


def test_warmup_cosine():
    config = OptimizerConfig(
        learning_rate=1.0,
        schedule=ScheduleConfig(
            "warmup_cosine", warmup_steps=10, total_steps=110, final_lr_ratio=0.1
        ),
    )
    steps = [0, 5, 10, 60, 110, 200]
    expected = [0.0, 0.5, 1.0, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)), 0.1, 0.1]
    np.testing.assert_allclose(values(build_schedule(config), steps), expected, atol=1e-6)


def test_warmup_linear():
    schedule = build_schedule(
        ScheduleConfig(
            "warmup_linear", warmup_steps=10, total_steps=30, final_lr_ratio=0.5, init_lr_ratio=0.2
        ),
        1.0,
    )
    got = values(schedule, [0, 5, 10, 20, 30, 40])
    np.testing.assert_allclose(got, [0.2, 0.6, 1.0, 0.75, 0.5, 0.5], atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "mid"), [("linear", 0.5), ("cosine", 0.5), ("sqrt", 1 - math.sqrt(0.5))]
)
def test_wsd_warmup_stable_decay(shape, mid):
    schedule = build_schedule(
        ScheduleConfig("wsd", warmup_steps=10, total_steps=100, decay_steps=20, decay_shape=shape),
        1.0,
    )
    got = values(schedule, [0, 5, 10, 50, 80, 90, 100, 120])
    np.testing.assert_allclose(got, [0, 0.5, 1, 1, 1, mid, 0, 0], atol=1e-6)


def test_inverse_sqrt():
    schedule = build_schedule(ScheduleConfig("inverse_sqrt", warmup_steps=100), 1.0)
    got = values(schedule, [0, 50, 100, 400, 10000])
    np.testing.assert_allclose(got, [0, 0.5, 1.0, 0.5, 0.1], rtol=1e-6)
    no_warmup = build_schedule(ScheduleConfig("inverse_sqrt"), 1.0)
    np.testing.assert_allclose(values(no_warmup, [0, 1, 4]), [1.0, 1.0, 0.5], rtol=1e-6)
