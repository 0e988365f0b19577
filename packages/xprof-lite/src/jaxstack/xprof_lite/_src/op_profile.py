"""Op profile: every executed HLO instruction/fusion with FLOPs, bytes, category and time.

Static numbers come from the optimised HLO module (see `cost.py`); measured times come from a
trace, joined to instructions by (`hlo_module`, `hlo_op`) — the names XLA gives its thunks and
kernels are the instruction names.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import tempfile
from pathlib import Path

import jax

from jaxstack.xprof_lite._src import tracefile
from jaxstack.xprof_lite._src.capture import compile_fn, memory_analysis_dict, trace
from jaxstack.xprof_lite._src.cost import (
    CATEGORIES,
    CONTAINERS,
    FREE,
    CostModel,
    executions_per_run,
)
from jaxstack.xprof_lite._src.hlo import parse_module


@dataclasses.dataclass
class OpStat:
    """One HLO instruction (or fusion) of a compiled module.

    `flops`, `transcendentals` and `bytes` are per execution; `executions` is how often it runs
    per module execution (loop trip counts); `time_ns` is measured self time per module
    execution (None without a trace).
    """

    name: str
    module: str
    computation: str
    opcode: str
    category: str
    op_name: str
    shape: str
    dtype: str
    flops: float
    transcendentals: float
    bytes: float
    executions: float = 1.0
    time_ns: float | None = None
    occurrences: int = 0

    @property
    def total_flops(self) -> float:
        return self.flops * self.executions

    @property
    def total_bytes(self) -> float:
        return self.bytes * self.executions

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else float("inf") if self.flops else 0.0


@dataclasses.dataclass
class OpProfile:
    """The op profile of one compiled module."""

    module: str
    ops: list[OpStat]
    module_runs: int = 0
    xla_cost: dict | None = None
    memory: dict | None = None
    # False for a module seen only in a trace (no HLO saved): its ops have times, not FLOPs.
    hlo_captured: bool = True

    @property
    def total_flops(self) -> float:
        return sum(op.total_flops for op in self.ops)

    @property
    def total_bytes(self) -> float:
        return sum(op.total_bytes for op in self.ops)

    @property
    def measured(self) -> bool:
        return any(op.time_ns is not None for op in self.ops)

    @property
    def total_time_ns(self) -> float:
        return sum(op.time_ns or 0.0 for op in self.ops)

    def op(self, name: str) -> OpStat:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no op named {name!r} in module {self.module!r}")

    def by_category(self) -> dict[str, dict[str, float]]:
        """Ops, FLOPs, bytes and measured time per category (all categories present)."""
        groups = {c: {"ops": 0, "flops": 0.0, "bytes": 0.0, "time_ns": 0.0} for c in CATEGORIES}
        for op in self.ops:
            g = groups[op.category]
            g["ops"] += 1
            g["flops"] += op.total_flops
            g["bytes"] += op.total_bytes
            g["time_ns"] += op.time_ns or 0.0
        return groups

    def top(self, n: int = 20, by: str = "time") -> list[OpStat]:
        """The `n` largest ops by measured `time` (falls back to FLOPs without a trace)."""
        if by == "time" and self.measured:
            key = lambda op: op.time_ns or 0.0
        elif by == "bytes":
            key = lambda op: op.total_bytes
        else:
            key = lambda op: op.total_flops
        return sorted(self.ops, key=key, reverse=True)[:n]

    def to_dict(self) -> dict:
        return {
            "module": self.module,
            "module_runs": self.module_runs,
            "hlo_captured": self.hlo_captured,
            "total_flops": self.total_flops if self.hlo_captured else None,
            "total_bytes": self.total_bytes if self.hlo_captured else None,
            "xla_cost": self.xla_cost,
            "memory": self.memory,
            "by_category": self.by_category(),
            "ops": [dataclasses.asdict(op) for op in self.ops],
        }


def analyze_hlo(text: str) -> OpProfile:
    """Op profile (no times) of an optimised HLO module's text."""
    module = parse_module(text)
    model = CostModel(module)
    ops = []
    for comp_name, times in executions_per_run(module).items():
        comp = module.computations[comp_name]
        for instr in comp.instructions.values():
            if instr.opcode in FREE or instr.opcode in CONTAINERS:
                continue
            flops, trans = model.flops(comp, instr)
            ops.append(
                OpStat(
                    name=instr.name,
                    module=module.name,
                    computation=comp_name,
                    opcode=instr.opcode,
                    category=model.category(comp, instr),
                    op_name=instr.op_name,
                    shape=" ".join(map(str, instr.shapes)),
                    dtype=instr.shapes[0].dtype if instr.shapes else "",
                    flops=flops,
                    transcendentals=trans,
                    bytes=model.bytes_accessed(comp, instr),
                    executions=times,
                )
            )
    return OpProfile(module.name, ops)


def join_times(profile: OpProfile, times: dict[tuple[str, str], tracefile.OpTime]) -> OpProfile:
    """Attach measured per-execution self times from `hlo_op_times` to the profile's ops."""
    mine = {op: t for (module, op), t in times.items() if module == profile.module}
    # Module executions: the most common event count of the ops that run once per execution
    # (an op that launches two kernels per run must not double the count).
    runs = [
        mine[op.name].occurrences for op in profile.ops if op.executions == 1.0 and op.name in mine
    ]
    runs = runs or [t.occurrences for t in mine.values()]
    profile.module_runs = min(statistics.multimode(runs)) if runs else 0
    for op in profile.ops:
        measured = mine.get(op.name)
        if measured is not None and profile.module_runs:
            op.time_ns = measured.total_ns / profile.module_runs
            op.occurrences = measured.occurrences
        elif profile.module_runs:
            op.time_ns = 0.0
    return profile


def op_profile(fn, *args, measure: int = 0, trace_data=None, **kwargs) -> OpProfile:
    """Profile every HLO instruction/fusion of `fn` compiled for `args`.

    Args:
      fn: a function, a `jax.jit` object or a `jax.stages.Compiled`.
      *args, **kwargs: example arguments (arrays or `jax.ShapeDtypeStruct`).
      measure: run the compiled function this many times under a trace and attach each op's
        measured time (needs real arrays).
      trace_data: join times from an existing trace instead (a `ProfileData`, xplane file, run
        directory or logdir in which this function ran).

    Example:
        prof = op_profile(lambda a, b: a @ b, jnp.ones((64, 32)), jnp.ones((32, 16)))
        prof.ops[0].flops  # 2 * 64 * 16 * 32 = 65536
    """
    compiled = compile_fn(fn, *args, **kwargs)
    profile = analyze_hlo(compiled.as_text())
    profile.xla_cost = _xla_cost(compiled)
    profile.memory = memory_analysis_dict(compiled)
    if measure:
        with tempfile.TemporaryDirectory() as tmp:
            # Warm up and finish outside the trace (dispatch is asynchronous).
            jax.block_until_ready(compiled(*args, **kwargs))
            with trace(Path(tmp), perfetto=False) as cap:
                for _ in range(measure):
                    jax.block_until_ready(compiled(*args, **kwargs))
            join_times(profile, tracefile.hlo_op_times(cap.profile_data()))
    elif trace_data is not None:
        join_times(profile, tracefile.hlo_op_times(tracefile.load_trace(trace_data)))
    return profile


def _xla_cost(compiled) -> dict | None:
    """XLA's own whole-module numbers, kept as a cross-check of the per-op sum."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # not every backend implements it
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    if not cost:
        return None
    return {k: float(cost[k]) for k in ("flops", "transcendentals", "bytes accessed") if k in cost}


_NAME_CATEGORY = (
    ("collective", re.compile(r"all-reduce|all-gather|reduce-scatter|all-to-all|collective")),
    ("attention", re.compile(r"attention|flash|fmha", re.I)),
    ("matmul", re.compile(r"dot|gemm|matmul|conv|ynn_fusion", re.I)),
    ("copy", re.compile(r"^(copy|transpose|slice|dynamic-slice|concatenate|pad)", re.I)),
    ("elementwise", re.compile(r"fusion|add|multiply|subtract|divide|exp|tanh|reduce|select")),
)


def profile_from_trace(data, hlo_texts: list[str] = ()) -> list[OpProfile]:
    """Op profiles of every module in a trace; modules with saved HLO text get FLOPs and bytes,
    the others only times, with a category guessed from the op name."""
    times = tracefile.hlo_op_times(data)
    profiles = []
    known = set()
    for text in hlo_texts:
        profile = join_times(analyze_hlo(text), times)
        known.add(profile.module)
        if profile.module_runs:
            profiles.append(profile)
    unknown: dict[str, list[tuple[str, tracefile.OpTime]]] = {}
    for (module, op), t in times.items():
        if module not in known:
            unknown.setdefault(module, []).append((op, t))
    for module, entries in unknown.items():
        runs = max(t.occurrences for _, t in entries)
        ops = [
            OpStat(
                name=op,
                module=module,
                computation="",
                opcode="",
                category=next((c for c, rx in _NAME_CATEGORY if rx.search(op)), "other"),
                op_name="",
                shape="",
                dtype="",
                flops=0.0,
                transcendentals=0.0,
                bytes=0.0,
                time_ns=t.total_ns / runs,
                occurrences=t.occurrences,
            )
            for op, t in entries
        ]
        profiles.append(OpProfile(module, ops, module_runs=runs, hlo_captured=False))
    return profiles
