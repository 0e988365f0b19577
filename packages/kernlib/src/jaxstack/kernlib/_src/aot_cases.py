"""The kernels' ahead-of-time cases: each Mosaic TPU kernel at representative shapes.

GQA at serving and training sizes, long context, bfloat16 and float32, int8 and int4 weights,
and odd sizes that the kernels must pad. Each case calls the public op with
`implementation="pallas_mosaic_tpu"` (forward, and forward + backward where the op is
differentiable), so compiling it checks the dispatch, the kernel's lowering and the TPU compiler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxstack.kernlib._src.aot import with_backward

MOSAIC = "pallas_mosaic_tpu"
S = jax.ShapeDtypeStruct
BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32


@dataclasses.dataclass(frozen=True)
class AotCase:
    """One kernel call to compile: `fn(*args)` with `args` as ShapeDtypeStructs (or None)."""

    op: str
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    backward: bool = False

    @property
    def label(self) -> str:
        return f"{self.op}: {self.name}" + (" (fwd+bwd)" if self.backward else " (fwd)")


class _QuantizedWeight(NamedTuple):
    """The quantised-tensor structure quantized_matmul recognises (as quantlib's tensors)."""

    values: Any
    scales: Any
    zero_points: Any
    dtype: Any
    shape: tuple[int, int]


def _attention_cases():
    from jaxstack.kernlib.ops.attention.api import attention

    def case(name, b, t, hq, hkv, d, dtype, segments=False, **options):
        q, kv = S((b, t, hq, d), dtype), S((b, t, hkv, d), dtype)
        seg = S((b, t), I32) if segments else None

        def fn(q, k, v, seg):
            return attention(q, k, v, segment_ids=seg, implementation=MOSAIC, **options)

        args = (q, kv, kv, seg)
        return [
            AotCase("attention", name, fn, args),
            AotCase("attention", name, with_backward(fn, (0, 1, 2)), args, backward=True),
        ]

    return [
        *case("GQA 32q/8kv d128, T=4096, causal, bf16", 1, 4096, 32, 8, 128, BF16),
        *case(
            "long context T=32768, 8q/1kv d128, window 4096, bf16",
            1,
            32768,
            8,
            1,
            128,
            BF16,
            sliding_window=4096,
        ),
        *case(
            "packed segments + soft cap, 2x2048, 16q/4kv d256, bf16",
            2,
            2048,
            16,
            4,
            256,
            BF16,
            segments=True,
            logits_soft_cap=50.0,
        ),
        *case("odd T=1000, d64, non-causal, f32 (padded)", 2, 1000, 4, 2, 64, F32, causal=False),
    ]


def _ragged_paged_attention_cases():
    from jaxstack.kernlib.ops.ragged_paged_attention.api import ragged_paged_attention

    def case(name, tokens, seqs, hq, hkv, d, page, pages, per_seq, dtype, **options):
        args = (
            S((tokens, hq, d), dtype),
            S((pages, page, hkv, d), dtype),
            S((pages, page, hkv, d), dtype),
            S((seqs,), I32),
            S((seqs, per_seq), I32),
            S((seqs + 1,), I32),
            S((), I32),
        )

        def fn(*a):
            return ragged_paged_attention(*a, implementation=MOSAIC, **options)

        return AotCase("ragged_paged_attention", name, fn, args)

    return [
        case(
            "decode 256 seqs, 32q/8kv d128, page 16, ctx 8k, bf16",
            256,
            256,
            32,
            8,
            128,
            16,
            16384,
            512,
            BF16,
        ),
        case(
            "mixed prefill+decode 1024 tokens, 64 seqs, 16q/2kv d128, bf16",
            1024,
            64,
            16,
            2,
            128,
            32,
            4096,
            256,
            BF16,
        ),
        case(
            "sliding window + soft cap, 8q/8kv d256, page 16, bf16",
            512,
            32,
            8,
            8,
            256,
            16,
            2048,
            128,
            BF16,
            sliding_window=1024,
            logits_soft_cap=30.0,
        ),
        case("odd 37 tokens, 5 seqs, 12q/4kv d64, page 8, f32", 37, 5, 12, 4, 64, 8, 100, 20, F32),
    ]


def _rms_norm_cases():
    from jaxstack.kernlib.ops.rms_norm.api import rms_norm

    def case(name, shape, dtype, weight=True):
        w = S((shape[-1],), dtype) if weight else None

        def fn(x, w):
            return rms_norm(x, w, implementation=MOSAIC)

        args = (S(shape, dtype), w)
        diff = (0, 1) if weight else (0,)
        return [
            AotCase("rms_norm", name, fn, args),
            AotCase("rms_norm", name, with_backward(fn, diff), args, backward=True),
        ]

    return [
        *case("8x4096 tokens x 4096, bf16", (8, 4096, 4096), BF16),
        *case("odd 3x77 x 1000, f32, no weight (padded)", (3, 77, 1000), F32, weight=False),
    ]


def _grouped_matmul_cases():
    from jaxstack.kernlib.ops.grouped_matmul.api import grouped_matmul

    def case(name, m, k, n, groups, dtype):
        def fn(lhs, rhs, sizes):
            return grouped_matmul(lhs, rhs, sizes, implementation=MOSAIC)

        args = (S((m, k), dtype), S((groups, k, n), dtype), S((groups,), I32))
        return [
            AotCase("grouped_matmul", name, fn, args),
            AotCase("grouped_matmul", name, with_backward(fn, (0, 1)), args, backward=True),
        ]

    return [
        *case("MoE 8 experts, 8192 x 4096 -> 14336, bf16", 8192, 4096, 14336, 8, BF16),
        *case("odd 1000 x 300 -> 200, 5 groups, f32 (padded)", 1000, 300, 200, 5, F32),
    ]


def _quantized_matmul_cases():
    from jaxstack.kernlib.ops.quantized_matmul.api import quantized_matmul

    def case(name, m, k, n, values_dtype, tile, dtype, zero_points=False):
        tiles = k // tile if tile else 1

        def fn(x, values, scales, zp):
            w = _QuantizedWeight(values, scales, zp, dtype, (k, n))
            return quantized_matmul(x, w, implementation=MOSAIC)

        args = (
            S((m, k), dtype),
            S((k, n), values_dtype),
            S((tiles, n), dtype),
            S((tiles, n), dtype) if zero_points else None,
        )
        return [
            AotCase("quantized_matmul", name, fn, args),
            AotCase("quantized_matmul", name, with_backward(fn, (0,)), args, backward=True),
        ]

    return [
        *case("int8 per-channel, 2048 x 4096 -> 14336, bf16", 2048, 4096, 14336, jnp.int8, 0, BF16),
        *case(
            "int4 tile 128 + zero points, 2048 x 4096 -> 4096, bf16",
            2048,
            4096,
            4096,
            jnp.int4,
            128,
            BF16,
            zero_points=True,
        ),
        *case("int8 decode M=7, 4096 -> 1000 (padded), f32", 7, 4096, 1000, jnp.int8, 256, F32),
    ]


def aot_cases(ops: tuple[str, ...] | None = None) -> list[AotCase]:
    """Every Mosaic TPU kernel's cases (or only those of `ops`)."""
    cases = [
        *_attention_cases(),
        *_ragged_paged_attention_cases(),
        *_rms_norm_cases(),
        *_grouped_matmul_cases(),
        *_quantized_matmul_cases(),
    ]
    return [c for c in cases if ops is None or c.op in ops]
