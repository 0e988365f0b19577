"""Block-size configurations: per-field rules, the sweep, and block-size fitting."""

import dataclasses

import pytest

from jaxstack import kernlib
from jaxstack.kernlib._src import config


@dataclasses.dataclass(frozen=True)
class Tiles(config.KernelConfig):
    block_m: int = config.multiple_of(128, 8)
    block_k: int = config.power_of_two(32, 16)
    num_warps: int = 4
    SWEEP = ((16, 64), (256, 16, 8))


def test_each_block_field_is_checked_by_its_rule():
    with pytest.raises(kernlib.ConfigError, match="block_m=12 must be a positive multiple of 8"):
        Tiles(block_m=12)
    with pytest.raises(kernlib.ConfigError, match="block_k=48 must be a power of two >= 16"):
        Tiles(block_k=48)
    assert Tiles(num_warps=3).num_warps == 3  # a field without a rule takes any value


def test_sweep_is_the_defaults_then_the_listed_candidates():
    assert Tiles.sweep() == [Tiles(), Tiles(16, 64), Tiles(256, 16, 8)]
    assert config.KernelConfig.sweep() == [config.KernelConfig()]


@pytest.mark.parametrize(
    ("block", "size", "minimum", "want"),
    [
        (64, 20, 16, 32),
        (64, 5, 16, 16),
        (64, 1000, 16, 64),
        (512, 300, 128, 512),
        (512, 129, 128, 256),
    ],
)
def test_clamp_block_to_the_power_of_two_a_size_needs(block, size, minimum, want):
    assert config.clamp_block(block, size, minimum) == want
