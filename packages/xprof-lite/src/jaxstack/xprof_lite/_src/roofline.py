"""The roofline of each op: how far it is from what the hardware allows.

An op with arithmetic intensity I (FLOPs per byte) can at best reach
min(peak FLOP/s, I * peak bytes/s). Below the ridge point (peak FLOP/s / peak bytes/s) it is
memory-bound, above it compute-bound. With a measured time, achieved FLOP/s (or, for ops without
FLOPs, achieved bytes/s) over that attainable rate is the fraction of the roofline reached.
"""

from __future__ import annotations

import dataclasses

from jaxstack.xprof_lite._src.op_profile import OpProfile, OpStat
from jaxstack.xprof_lite._src.peak import DevicePeak


@dataclasses.dataclass(frozen=True)
class RooflinePoint:
    """One op on the roofline: its FLOPs, bytes and arithmetic intensity (FLOPs per byte),
    whether it is compute- or memory-bound at the device peak, the attainable FLOP/s and ideal
    time there, and (when the trace timed it) the achieved FLOP/s, bytes/s and fraction of ideal."""

    op: str
    category: str
    flops: float
    bytes: float
    intensity: float
    bound: str  # "compute" | "memory"
    attainable_flops_per_s: float
    ideal_time_ns: float
    time_ns: float | None
    achieved_flops_per_s: float | None
    achieved_bytes_per_s: float | None
    achieved_fraction: float | None


def roofline_point(op: OpStat, peak: DevicePeak) -> RooflinePoint:
    flops, nbytes = op.total_flops, op.total_bytes
    peak_flops = peak.flops_for(op.dtype)
    ridge = peak_flops / peak.bytes_per_s
    intensity = op.intensity
    bound = "compute" if intensity >= ridge else "memory"
    attainable = min(peak_flops, intensity * peak.bytes_per_s)
    ideal_s = max(flops / peak_flops, nbytes / peak.bytes_per_s)
    achieved_flops = achieved_bytes = fraction = None
    if op.time_ns:
        seconds = op.time_ns * 1e-9
        achieved_flops = flops / seconds
        achieved_bytes = nbytes / seconds
        fraction = ideal_s / seconds if ideal_s else None
    return RooflinePoint(
        op=op.name,
        category=op.category,
        flops=flops,
        bytes=nbytes,
        intensity=intensity,
        bound=bound,
        attainable_flops_per_s=attainable,
        ideal_time_ns=ideal_s * 1e9,
        time_ns=op.time_ns,
        achieved_flops_per_s=achieved_flops,
        achieved_bytes_per_s=achieved_bytes,
        achieved_fraction=fraction,
    )


def roofline(profile: OpProfile, peak: DevicePeak) -> list[RooflinePoint]:
    """One roofline point per op that does work (FLOPs or bytes)."""
    return [roofline_point(op, peak) for op in profile.ops if op.total_flops or op.total_bytes]
