"""Numbers as people read them: 3 significant digits and an SI prefix (12.3 MFLOP, 7.9 G)."""

from __future__ import annotations


def si(value: float, unit: str = "") -> str:
    """`value` with the largest SI prefix (k to P) that keeps it at least 1."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()
