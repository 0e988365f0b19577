"""FLOPs, bytes and category of each HLO instruction, counted the way XLA's cost model counts.

- dot: 2 * (result elements) * (product of the lhs contracting dimensions), exact.
- convolution: 2 * (output elements) * (kernel input features) * (kernel spatial size); padding
  positions are counted as real work, as XLA does.
- elementwise: one FLOP per result element; exp/log/tanh/... count as transcendentals instead.
- reduce: (input elements - output elements) * FLOPs of the reducer.
- fusion: the sum of its fused instructions' FLOPs; bytes are what the fusion reads and writes
  at its boundary (sliced operands count only the slice; an in-place dynamic-update-slice
  only the update).
"""

from __future__ import annotations

import json
import math
import re

from jaxstack.xprof_lite._src.hlo import Computation, Instruction, Module, Shape

TRANSCENDENTAL = frozenset(
    [
        "exponential",
        "exponential-minus-one",
        "log",
        "log-plus-one",
        "logistic",
        "power",
        "sqrt",
        "cbrt",
        "rsqrt",
        "tanh",
        "sine",
        "cosine",
        "tan",
        "atan2",
        "erf",
    ]
)
ELEMENTWISE = (
    frozenset(
        [
            "add",
            "subtract",
            "multiply",
            "divide",
            "maximum",
            "minimum",
            "negate",
            "abs",
            "compare",
            "select",
            "clamp",
            "and",
            "or",
            "xor",
            "not",
            "remainder",
            "sign",
            "floor",
            "ceil",
            "round-nearest-afz",
            "round-nearest-even",
            "shift-left",
            "shift-right-arithmetic",
            "shift-right-logical",
            "popcnt",
            "count-leading-zeros",
            "is-finite",
            "real",
            "imag",
            "complex",
            "convert",
            "stochastic-convert",
            "reduce-precision",
        ]
    )
    | TRANSCENDENTAL
)
REDUCTIONS = frozenset({"reduce", "reduce-window", "select-and-scatter", "map", "scatter"})
COLLECTIVE_PREFIXES = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "collective-broadcast", "ragged-all-to-all", "send", "recv",
)  # fmt: skip
DATA_MOVEMENT = frozenset(
    [
        "copy",
        "copy-start",
        "copy-done",
        "transpose",
        "slice",
        "dynamic-slice",
        "dynamic-update-slice",
        "concatenate",
        "pad",
        "reverse",
        "broadcast",
        "reshape",
        "gather",
        "scatter",
        "iota",
    ]
)
SLICING = frozenset({"slice", "dynamic-slice", "gather"})
# Instructions that are bookkeeping, not work: never listed.
FREE = frozenset(
    [
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
        "domain",
        "get-dimension-size",
    ]
)
# Instructions whose work is that of the computations they run (listed there instead).
CONTAINERS = frozenset({"while", "conditional", "call"})
# Instructions whose work is a called computation run as one unit (async-start wraps e.g. an
# all-reduce or a fusion that runs concurrently on GPU/TPU).
WRAPPERS = frozenset({"fusion", "async-start"})
ATTENTION_HINT = re.compile(r"attention|attn|flash|sdpa|splash|fmha|mha\b", re.I)
CATEGORIES = ("matmul", "attention", "elementwise", "collective", "copy", "other")
"""The op categories of the op profile and the roofline, in report order."""


def _contracting(instr: Instruction, key: str, lhs: Shape) -> int:
    dims = instr.attrs.get(key, "{}").strip("{}")
    return math.prod(lhs.dims[int(d)] for d in dims.split(",") if d.strip())


def _gemm_contracting(instr: Instruction, lhs: Shape) -> int | None:
    """Contracting size of a cuBLAS/cuBLASLt gemm custom call, from its backend config JSON."""
    raw = instr.attrs.get("backend_config", "")
    try:
        config = json.loads(raw)
        if isinstance(config, str):  # some XLA versions print the JSON as a quoted string
            config = json.loads(config)
    except ValueError:
        return None
    numbers = config.get("gemm_backend_config", config).get("dot_dimension_numbers")
    if not numbers:
        return None
    dims = numbers.get("lhs_contracting_dimensions", [])
    return math.prod(lhs.dims[int(d)] for d in dims)


def _conv_flops(instr: Instruction, out: Shape, kernel: Shape) -> float:
    labels = instr.attrs.get("dim_labels", "")
    kernel_labels = labels.split("_")[1].split("->")[0] if "_" in labels else ""
    if len(kernel_labels) != len(kernel.dims):
        return 2.0 * out.elements * kernel.elements  # no labels: an upper bound
    size = math.prod(d for lab, d in zip(kernel_labels, kernel.dims, strict=True) if lab != "o")
    return 2.0 * out.elements * size


class CostModel:
    """Per-instruction costs over one parsed module (fused computations resolved by name)."""

    def __init__(self, module: Module):
        self.module = module

    def shape_of(self, comp: Computation, name: str) -> tuple[Shape, ...]:
        instr = comp.instructions.get(name)
        return instr.shapes if instr is not None else ()

    def _first_operand(self, comp: Computation, instr: Instruction, i: int) -> Shape | None:
        if i >= len(instr.operands):
            return None
        shapes = self.shape_of(comp, instr.operands[i])
        return shapes[0] if shapes else None

    def reducer_flops(self, instr: Instruction) -> float:
        """FLOPs of one application of a reduce/map/scatter computation (at least 1)."""
        total = 0.0
        for name in instr.called("to_apply"):
            sub = self.module.computations.get(name)
            if sub is not None:
                total += sum(self.flops(sub, i)[0] for i in sub.instructions.values())
        return max(total, 1.0)

    def flops(self, comp: Computation, instr: Instruction) -> tuple[float, float]:
        """(FLOPs, transcendentals) of one execution of `instr`."""
        op = instr.opcode
        out = instr.shapes[0] if instr.shapes else Shape("f32", ())
        if op in WRAPPERS:
            flops = trans = 0.0
            for name in instr.called("calls"):
                sub = self.module.computations.get(name)
                if sub is not None:
                    for inner in sub.instructions.values():
                        f, t = self.flops(sub, inner)
                        flops, trans = flops + f, trans + t
            return flops, trans
        if op == "dot":
            lhs = self._first_operand(comp, instr, 0)
            if lhs is None:
                return 0.0, 0.0
            return 2.0 * out.elements * _contracting(instr, "lhs_contracting_dims", lhs), 0.0
        if op == "convolution":
            kernel = self._first_operand(comp, instr, 1)
            return (_conv_flops(instr, out, kernel), 0.0) if kernel else (0.0, 0.0)
        if op == "custom-call":
            target = instr.attrs.get("custom_call_target", "").lower()
            lhs = self._first_operand(comp, instr, 0)
            if lhs is not None and ("gemm" in target or "matmul" in target):
                k = _gemm_contracting(instr, lhs)
                return (2.0 * out.elements * k, 0.0) if k else (0.0, 0.0)
            if "conv" in target and "dim_labels" in instr.attrs:
                kernel = self._first_operand(comp, instr, 1)
                return (_conv_flops(instr, out, kernel), 0.0) if kernel else (0.0, 0.0)
            return 0.0, 0.0
        if op in TRANSCENDENTAL:
            return 0.0, float(instr.result_elements)
        if op in ELEMENTWISE:
            return float(instr.result_elements), 0.0
        if op == "reduce":
            first = self._first_operand(comp, instr, 0)
            inputs = first.elements if first else 0
            outputs = instr.shapes[0].elements if instr.shapes else 0
            return max(inputs - outputs, 0) * self.reducer_flops(instr), 0.0
        if op in ("reduce-window", "select-and-scatter"):
            window = re.search(r"size=([0-9x]+)", instr.attrs.get("window", ""))
            size = math.prod(int(s) for s in window.group(1).split("x")) if window else 1
            # Combining a window of n values takes n - 1 reducer applications (as XLA counts).
            return float(out.elements * max(size - 1, 0)) * self.reducer_flops(instr), 0.0
        if op == "map":
            return float(out.elements) * self.reducer_flops(instr), 0.0
        if op == "scatter":
            updates = self._first_operand(comp, instr, len(instr.operands) - 1)
            return float(updates.elements if updates else 0) * self.reducer_flops(instr), 0.0
        return 0.0, 0.0

    def bytes_accessed(self, comp: Computation, instr: Instruction) -> float:
        """Bytes read and written by one execution of `instr` at its boundary."""
        op = instr.opcode
        operand_bytes = [sum(s.nbytes for s in self.shape_of(comp, o)) for o in instr.operands]
        if op in SLICING:
            return 2.0 * instr.result_bytes
        if op == "dynamic-update-slice" and len(operand_bytes) > 1:
            return 2.0 * operand_bytes[1]
        if op != "fusion":
            return sum(operand_bytes) + instr.result_bytes
        fused = next(
            (self.module.computations[n] for n in instr.called("calls")
             if n in self.module.computations),
            None,
        )  # fmt: skip
        if fused is None:
            return sum(operand_bytes) + instr.result_bytes
        params = {
            _param_index(i): i.name for i in fused.instructions.values() if i.opcode == "parameter"
        }
        users: dict[str, list[Instruction]] = {}
        for inner in fused.instructions.values():
            for operand in inner.operands:
                users.setdefault(operand, []).append(inner)
        written = instr.result_bytes
        root = fused.root
        in_place = None
        if root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
            in_place = root.operands[0]
            written = sum(s.nbytes for s in self.shape_of(fused, root.operands[1]))
        read = 0.0
        for index, full in enumerate(operand_bytes):
            param = params.get(index)
            param_users = users.get(param, []) if param else []
            if param is not None and param == in_place:
                continue
            if param_users and all(u.opcode in SLICING for u in param_users):
                read += min(full, sum(u.result_bytes for u in param_users))
            else:
                read += full
        return read + written

    def category(self, comp: Computation, instr: Instruction) -> str:
        op = instr.opcode
        target = instr.attrs.get("custom_call_target", "")
        if ATTENTION_HINT.search(instr.op_name) or ATTENTION_HINT.search(target):
            return "attention"
        opcodes = self._opcodes(instr)
        if any(o.startswith(COLLECTIVE_PREFIXES) for o in opcodes):
            return "collective"
        if opcodes & {"dot", "convolution"} or (
            op == "custom-call" and re.search(r"gemm|matmul|conv", target, re.I)
        ):
            return "matmul"
        work = opcodes - FREE
        if work & (ELEMENTWISE | REDUCTIONS) - {"convert"}:
            return "elementwise"
        if work and work <= DATA_MOVEMENT | {"convert"}:
            return "copy"
        return "other"

    def _opcodes(self, instr: Instruction) -> set[str]:
        if instr.opcode not in WRAPPERS:
            return {instr.opcode}
        found: set[str] = set()
        for name in instr.called("calls"):
            sub = self.module.computations.get(name)
            if sub is not None:
                for inner in sub.instructions.values():
                    found |= self._opcodes(inner)
        return found


def _param_index(instr: Instruction) -> int:
    """`parameter(3)` keeps its index as the operand text."""
    try:
        return int(instr.operands[0])
    except (IndexError, ValueError):
        return -1


def executions_per_run(module: Module) -> dict[str, float]:
    """How many times each executed (non-fused) computation runs per module execution.

    A while body runs `known_trip_count` times (1 when XLA does not know it); conditional
    branches are counted once each (an upper bound); fused and reducer computations are not here.
    """
    counts: dict[str, float] = {}
    entry = module.entry

    def visit(comp: Computation, times: float) -> None:
        counts[comp.name] = counts.get(comp.name, 0.0) + times
        for instr in comp.instructions.values():
            if instr.opcode == "while":
                trip = re.search(
                    r'"known_trip_count":\{"n":"(\d+)"', instr.attrs.get("backend_config", "")
                )
                n = float(trip.group(1)) if trip else 1.0
                for name in instr.called("body"):
                    if name in module.computations:
                        visit(module.computations[name], times * n)
                for name in instr.called("condition"):
                    if name in module.computations:
                        visit(module.computations[name], times * (n + 1))
            elif instr.opcode == "conditional":
                branches = instr.called("branch_computations") or (
                    instr.called("true_computation") + instr.called("false_computation")
                )
                for name in branches:
                    if name in module.computations:
                        visit(module.computations[name], times)
            elif instr.opcode == "call":
                for name in instr.called("to_apply"):
                    if name in module.computations:
                        visit(module.computations[name], times)

    visit(entry, 1.0)
    return counts
