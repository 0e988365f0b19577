"""The quantised number formats: how a scaled value becomes a code and back.

- `int8`, `int4`: symmetric integers (int4 codes are stored two per byte).
- `fp8_e4m3`, `fp8_e5m2`: the OCP 8-bit floats (e4m3 has more precision, e5m2 more range).
- `nf4` (weights only): QLoRA's 4-bit NormalFloat, sixteen levels at the quantiles of a normal
  distribution scaled to [-1, 1], stored as 4-bit indices two per byte.

A format's `qmax` is the magnitude of its largest code. A block's scale is its calibrated bound
divided by the format's `scale_bound`: for the float formats that is `qmax` (the bound maps
onto the largest value); for the integers it is `qmax + 0.5`, the outer edge of the top code's
rounding bucket (Qwix's and AQT's rule), so every step is 1/15 (int4) or 1/255 (int8) of the
range instead of 1/14 or 1/254, and a value at the bound is clipped by half a step. Integer
codes are symmetric (-qmax..qmax): the bound itself lands on a rounding tie (7.5), and which
of -7 or -8 a tie at the negative bound took would depend on the last bit of the scale's
float arithmetic; both are half a step away, so clipping to -qmax first makes the choice
deterministic (the same codes from PTQ and from QAT's fake quantisation) at no cost in error.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.quantlib._src.errors import RuleError

# QLoRA (Dettmers et al. 2023), appendix E: the 16 NF4 levels.
NF4_LEVELS = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    np.float32,
)


@dataclasses.dataclass(frozen=True)
class QType:
    name: str
    kind: str  # "int", "float" or "nf"
    bits: int
    qmax: float
    storage: jnp.dtype  # dtype of the stored codes (packed 4-bit formats: uint8)
    weights_only: bool = False

    @property
    def packed(self) -> bool:
        return self.bits == 4

    @property
    def scale_bound(self) -> float:
        """The scaled magnitude a block's calibrated bound maps onto (see the module doc)."""
        return self.qmax + 0.5 if self.kind == "int" else self.qmax


QTYPES = {
    q.name: q
    for q in (
        QType("int8", "int", 8, 127.0, jnp.dtype(jnp.int8)),
        QType("int4", "int", 4, 7.0, jnp.dtype(jnp.uint8)),
        QType("fp8_e4m3", "float", 8, 448.0, jnp.dtype(jnp.float8_e4m3fn)),
        QType("fp8_e5m2", "float", 8, 57344.0, jnp.dtype(jnp.float8_e5m2)),
        QType("nf4", "nf", 4, 1.0, jnp.dtype(jnp.uint8), weights_only=True),
    )
}
"""The supported formats by name (`QuantRule(qtype=...)`): int8, int4, fp8_e4m3, fp8_e5m2 and
nf4 (weights only); see the module docstring for their codes and scales."""


def get_qtype(name: str, field: str = "qtype", *, weights: bool = True) -> QType:
    """The format called `name`; an unknown name lists the supported ones."""
    q = QTYPES.get(name)
    if q is None:
        raise RuleError(f"{field}={name!r} is not a supported qtype; use one of {list(QTYPES)}")
    if q.weights_only and not weights:
        supported = [n for n, t in QTYPES.items() if not t.weights_only]
        raise RuleError(f"{field}={name!r} is for weights only; activations take {supported}")
    return q


def encode(scaled: jax.Array, q: QType) -> jax.Array:
    """Codes of `scaled` (values already divided by their scale), clipped to the format."""
    if q.kind == "int":
        return jnp.round(jnp.clip(scaled, -q.qmax, q.qmax)).astype(jnp.int8)
    if q.kind == "float":
        return jnp.clip(scaled, -q.qmax, q.qmax).astype(q.storage)
    levels = jnp.asarray(NF4_LEVELS)
    nearest = jnp.argmin(jnp.abs(jnp.clip(scaled, -1.0, 1.0)[..., None] - levels), axis=-1)
    return nearest.astype(jnp.uint8)


def decode(codes: jax.Array, q: QType) -> jax.Array:
    """float32 values of `codes` (unpacked), still to be multiplied by their scale."""
    if q.kind == "nf":
        return jnp.asarray(NF4_LEVELS)[codes.astype(jnp.int32)]
    return codes.astype(jnp.float32)


def pack(codes: jax.Array) -> jax.Array:
    """Two 4-bit codes per byte along axis 0: row 2i in the low nibble, row 2i+1 in the high."""
    if codes.shape[0] % 2:
        raise RuleError(
            f"4-bit formats pack two rows per byte; the contracted size {codes.shape[0]} is odd"
        )
    nibbles = codes.astype(jnp.uint8) & 0xF
    return nibbles[0::2] | (nibbles[1::2] << 4)


def unpack(values: jax.Array, q: QType) -> jax.Array:
    """Inverse of `pack`: int8 codes for int4 (sign-extended), uint8 indices for nf4."""
    nibbles = jnp.stack([values & 0xF, values >> 4], axis=1).reshape(-1, *values.shape[1:])
    if q.kind == "int":
        return ((nibbles.astype(jnp.int8) ^ 8) - 8).astype(jnp.int8)
    return nibbles
