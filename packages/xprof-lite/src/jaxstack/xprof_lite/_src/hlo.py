"""A small reader for the text form of an optimised HLO module (`compiled.as_text()`).

XLA's whole-module `cost_analysis()` sums everything into one number; to say where time goes we
need each instruction's opcode, result shape, operands and attributes. The text form is stable
enough across XLA versions for that (both the `%name` and the bare-name spelling are accepted, and
operands may or may not carry their types), and it needs no protobuf definitions.
"""

from __future__ import annotations

import dataclasses
import math
import re

from jaxstack.xprof_lite._src.errors import Error

# Bytes per element; sub-byte types are fractional so that packed arrays count what they use.
DTYPE_BYTES: dict[str, float] = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1,
    "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "token": 0,
    "f4e2m1fn": 0.5, "f8e8m0fnu": 1, "f8e3m4": 1, "f8e4m3": 1, "f8e4m3fn": 1,
    "f8e4m3fnuz": 1, "f8e4m3b11fnuz": 1, "f8e5m2": 1, "f8e5m2fnuz": 1,
}  # fmt: skip

_ARRAY_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")


@dataclasses.dataclass(frozen=True)
class Shape:
    """One array shape; a tuple-shaped result is a tuple of these."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> float:
        return self.elements * DTYPE_BYTES.get(self.dtype, 4)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


def parse_shapes(type_text: str) -> tuple[Shape, ...]:
    """All array shapes in an HLO type (`f32[2,3]{1,0}` or a nested tuple of such)."""
    shapes = []
    for dtype, dims in _ARRAY_SHAPE.findall(type_text):
        if dtype not in DTYPE_BYTES:
            continue
        parsed = tuple(int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip())
        shapes.append(Shape(dtype, parsed))
    return tuple(shapes)


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    shapes: tuple[Shape, ...]
    operands: tuple[str, ...]
    attrs: dict[str, str]
    type_text: str
    is_root: bool = False

    @property
    def result_bytes(self) -> float:
        return sum(s.nbytes for s in self.shapes)

    @property
    def result_elements(self) -> int:
        return sum(s.elements for s in self.shapes)

    @property
    def op_name(self) -> str:
        """The JAX-level name from metadata (`jit(f)/dot_general`), or ''."""
        match = re.search(r'op_name="([^"]*)"', self.attrs.get("metadata", ""))
        return match.group(1) if match else ""

    def called(self, key: str) -> list[str]:
        """Computation names in an attribute such as `calls=` or `branch_computations=`."""
        value = self.attrs.get(key, "")
        return [n.strip().lstrip("%") for n in value.strip("{}").split(",") if n.strip()]


@dataclasses.dataclass
class Computation:
    name: str
    instructions: dict[str, Instruction]
    is_entry: bool = False

    @property
    def root(self) -> Instruction:
        for instr in self.instructions.values():
            if instr.is_root:
                return instr
        return next(reversed(self.instructions.values()))


@dataclasses.dataclass
class Module:
    name: str
    computations: dict[str, Computation]

    @property
    def entry(self) -> Computation:
        for comp in self.computations.values():
            if comp.is_entry:
                return comp
        raise Error(f"HLO module {self.name!r} has no ENTRY computation; pass compiled.as_text()")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside (), {}, [] and quotes."""
    parts, depth, quote, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quote = not quote
        elif quote:
            continue
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _matching(text: str, start: int) -> int:
    """Index just past the bracket closing the one at `start`."""
    opening, depth, quote = text[start], 0, False
    closing = {"(": ")", "{": "}", "[": "]"}[opening]
    for i in range(start, len(text)):
        ch = text[i]
        if ch == '"' and text[i - 1] != "\\":
            quote = not quote
        elif quote:
            continue
        elif ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return i + 1
    raise Error(f"unbalanced {opening!r} in HLO text: {text[:120]!r}")


def parse_instruction(line: str) -> Instruction | None:
    text = line.strip()
    is_root = text.startswith("ROOT ")
    if is_root:
        text = text[5:]
    if " = " not in text:
        return None
    name, rest = text.split(" = ", 1)
    end = _matching(rest, 0) if rest.startswith("(") else rest.find(" ")
    type_text, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren <= 0:
        return None
    opcode = rest[:paren]
    close = _matching(rest, paren)
    operands = tuple(
        token.split()[-1].lstrip("%") for token in _split_top(rest[paren + 1 : close - 1])
    )
    attrs: dict[str, str] = {}
    for item in _split_top(rest[close:].lstrip(", ")):
        key, _, value = item.partition("=")
        attrs[key.strip()] = value.strip()
    return Instruction(
        name=name.strip().lstrip("%"),
        opcode=opcode,
        shapes=parse_shapes(type_text),
        operands=operands,
        attrs=attrs,
        type_text=type_text,
        is_root=is_root,
    )


def parse_module(text: str) -> Module:
    """Parse `compiled.as_text()` into computations of instructions."""
    header = re.search(r"^HloModule\s+([^\s,]+)", text, re.M)
    if header is None:
        raise Error(
            "text does not start an HLO module (no 'HloModule' line); pass the optimised "
            "module text, e.g. jax.jit(f).lower(*args).compile().as_text()"
        )
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            stripped = line.strip()
            if stripped.endswith("{") and " -> " in stripped and not line.startswith(" "):
                is_entry = stripped.startswith("ENTRY ")
                name = stripped.removeprefix("ENTRY ").split(" ", 1)[0].lstrip("%")
                current = Computation(name, {}, is_entry)
            continue
        if line.startswith("}"):
            computations[current.name] = current
            current = None
            continue
        instr = parse_instruction(line)
        if instr is not None:
            current.instructions[instr.name] = instr
    return Module(header.group(1), computations)
