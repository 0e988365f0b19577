"""Lowering kernels for a device this machine does not have (ahead-of-time checks).

`lower_for("gpu", fn, *args)` runs the real Pallas Triton lowering (Triton IR for an H100) and
`lower_for("tpu", ...)` the real Mosaic lowering, on a CPU-only host. That catches what
interpret mode cannot: non-power-of-two Triton tiles, illegal TPU block shapes, unsupported
primitives. Final compilation (ptxas, the TPU compiler) still needs the device.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax._src import mesh as mesh_lib

TARGETS = {
    "gpu": ("cuda", "NVIDIA H100"),
    "tpu": ("tpu", "TPU v5 lite"),
}


def lower_for(platform: str, fn, *args: Any) -> str:
    """StableHLO text of `jax.jit(fn)` lowered for `platform` ('gpu' or 'tpu')."""
    lowering_platform, kind = TARGETS[platform]
    device = mesh_lib.AbstractDevice(device_kind=kind, num_cores=1, platform=platform)
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        traced = jax.jit(fn).trace(*args)
        return traced.lower(lowering_platforms=(lowering_platform,)).as_text()


# what one Pallas kernel call looks like in the lowered text, per platform
KERNEL_MARKERS = {"gpu": "__gpu$xla.gpu.triton", "tpu": "@tpu_custom_call"}


def count_kernels(platform: str, fn, *args: Any) -> int:
    """How many Pallas kernel calls `lower_for(platform, fn, *args)` contains."""
    return lower_for(platform, fn, *args).count(KERNEL_MARKERS[platform])


def with_backward(fn):
    """fn(*args) -> out becomes (*args) -> (out, grads of args for cotangent out), so one
    lowering holds the forward and the backward kernels."""

    def both(*args):
        out, vjp = jax.vjp(fn, *args)
        return out, vjp(out)

    return both


def _abstract(dtype, *shapes):
    return tuple(jax.ShapeDtypeStruct(shape, dtype) for shape in shapes)


# Abstract arguments the lowering tests use, per op: bf16 at the sizes the kernels are built for.
ARGS = {
    # q [1, 512, 8, 128], k / v with 2 kv heads (GQA), segment ids
    "attention": (
        *_abstract(jnp.bfloat16, (1, 512, 8, 128), (1, 512, 2, 128), (1, 512, 2, 128)),
        *_abstract(jnp.int32, (1, 512)),
    ),
    # lhs [4096, 1024], rhs of 8 groups [8, 1024, 512], group sizes
    "grouped_matmul": (
        *_abstract(jnp.bfloat16, (4096, 1024), (8, 1024, 512)),
        *_abstract(jnp.int32, (8,)),
    ),
    # serving-sized: 64 rows, 32 q / 8 kv heads of 128, 4097 pages, 64 sequences of 128 pages
    "ragged_paged_attention": (
        *_abstract(jnp.bfloat16, (64, 32, 128), (4097, 16, 8, 128), (4097, 16, 8, 128)),
        *_abstract(jnp.int32, (64,), (64, 128), (65,)),
    ),
    # x [4096, 4096] and weight [4096]
    "rms_norm": _abstract(jnp.bfloat16, (4096, 4096), (4096,)),
}
