"""Block-size configurations: small frozen dataclasses that round-trip through JSON.

Every Pallas implementation has one; the tuning cache stores them as plain dicts (results are
data, not code), and `from_dict` refuses unknown keys so a stale cache entry fails loudly.
A block-size field states its rule where it is declared (`power_of_two` for Triton tiles,
`multiple_of` for TPU sublanes and lanes), and `SWEEP` lists the autotuner's candidates as data.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Self

from jaxstack.kernlib._src.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Base of per-implementation configurations (block sizes, warps, stages)."""

    SWEEP: ClassVar[tuple[tuple[int, ...], ...]] = ()
    """Candidates besides the defaults, as positional field values (`sweep` builds them)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if "check" in f.metadata:
                f.metadata["check"](f.name, getattr(self, f.name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"{cls.__name__} has no field(s) {unknown}; valid fields are {sorted(names)}"
            )
        return cls(**data)

    @classmethod
    def coerce(cls, value: Any) -> Self:
        """Accept an instance, a dict (as stored in the tuning cache) or None (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        raise ConfigError(
            f"config must be a {cls.__name__}, a dict of its fields or None, got {value!r}"
        )

    @classmethod
    def sweep(cls) -> list[Self]:
        """Candidate configurations the autotuner times (defaults first, so ties keep them)."""
        return [cls(), *(cls(*values) for values in cls.SWEEP)]


def power_of_two(default: int, minimum: int = 1) -> Any:
    """A block-size field that must be a power of two >= `minimum` (Triton tiles)."""
    check = functools.partial(check_power_of_two, minimum=minimum)
    return dataclasses.field(default=default, metadata={"check": check})


def multiple_of(default: int, multiple: int) -> Any:
    """A block-size field that must be a positive multiple of `multiple` (TPU tiles)."""
    check = functools.partial(check_multiple, multiple=multiple)
    return dataclasses.field(default=default, metadata={"check": check})


def check_power_of_two(name: str, value: int, minimum: int = 1) -> None:
    if value < minimum or value & (value - 1):
        raise ConfigError(f"{name}={value} must be a power of two >= {minimum}")


def check_multiple(name: str, value: int, multiple: int) -> None:
    """TPU tiles want block sizes in whole (8-row) sublanes or (128-wide) lanes."""
    if value < multiple or value % multiple:
        raise ConfigError(f"{name}={value} must be a positive multiple of {multiple}")


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def clamp_block(block: int, size: int, minimum: int) -> int:
    """`block`, or less when `size` (rounded up to a power of two) needs less, but >= `minimum`."""
    return max(minimum, min(block, next_power_of_two(size)))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
