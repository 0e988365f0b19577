"""Grouped matmul: rows of `lhs` sorted by group, each group multiplied by its own `rhs[g]`.

`out[r] = lhs[r] @ rhs[g]` for rows r in group g's range `[sum(sizes[:g]), sum(sizes[:g+1]))`;
rows past `sum(group_sizes)` are 0 (the `jax.lax.ragged_dot` contract). The Pallas kernels walk
"visits": (group, row tile) pairs in row order, at most `ceil(M / block_m) + G - 1` of them, so
a tile shared by two groups is computed once per group and each group writes only its own rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxstack.kernlib._src.errors import ConfigError
from jaxstack.kernlib._src.spec import spec_key


def validate(lhs, rhs, group_sizes) -> None:
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.ndim != 1:
        raise ConfigError(
            f"grouped_matmul expects lhs [M,K], rhs [G,K,N], group_sizes [G]; got lhs "
            f"{lhs.shape}, rhs {rhs.shape}, group_sizes {group_sizes.shape}"
        )
    if lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != group_sizes.shape[0]:
        raise ConfigError(
            f"shapes disagree: lhs {lhs.shape} needs rhs [G,{lhs.shape[1]},N] and group_sizes "
            f"[G]; got rhs {rhs.shape}, group_sizes {group_sizes.shape}"
        )
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ConfigError(f"group_sizes must be integer, got {group_sizes.dtype}")


def mixed_dtypes(lhs, rhs) -> str | None:
    """Why a Pallas kernel cannot run (lhs and rhs differ in dtype), or None: both kernels feed
    them to one matmul."""
    if lhs.dtype != rhs.dtype:
        return f"mixed dtypes {lhs.dtype} x {rhs.dtype} (use quantized_matmul for int weights)"
    return None


def out_dtype(lhs, rhs, preferred_element_type):
    return preferred_element_type or jnp.promote_types(lhs.dtype, rhs.dtype)


def reference(lhs, rhs, group_sizes, *, preferred_element_type=None):
    return jax.lax.ragged_dot(
        lhs,
        rhs,
        group_sizes.astype(jnp.int32),
        preferred_element_type=out_dtype(lhs, rhs, preferred_element_type),
    )


def group_bounds(group_sizes, num_rows: int):
    ends = jnp.minimum(jnp.cumsum(group_sizes.astype(jnp.int32)), num_rows)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    return starts, ends


def visits(group_sizes, num_rows: int, block_m: int):
    """(group, row tile, first row, end row) per visit; unused visits repeat the last one
    with an empty row range, so kernels that accumulate across visits stay consistent."""
    g_count = group_sizes.shape[0]
    num_tiles = -(-num_rows // block_m)
    n_visits = num_tiles + g_count - 1
    starts, ends = group_bounds(group_sizes, num_rows)
    sizes = ends - starts
    first = starts // block_m
    n = jnp.where(sizes > 0, (ends - 1) // block_m - first + 1, 0)
    cum = jnp.cumsum(n)
    total = cum[-1]
    v = jnp.arange(n_visits, dtype=jnp.int32)
    v_eff = jnp.minimum(v, jnp.maximum(total - 1, 0))
    group = jnp.minimum(jnp.searchsorted(cum, v_eff, side="right"), g_count - 1).astype(jnp.int32)
    tile = jnp.clip(first[group] + v_eff - (cum[group] - n[group]), 0, num_tiles - 1)
    valid = v < total
    lo = jnp.where(valid, starts[group], 0)
    hi = jnp.where(valid, ends[group], 0)
    return group, tile.astype(jnp.int32), lo.astype(jnp.int32), hi.astype(jnp.int32)


def zero_tail(out, group_sizes):
    """Rows past sum(group_sizes) are 0 (kernels never write them)."""
    total = jnp.sum(group_sizes.astype(jnp.int32))
    rows = jnp.arange(out.shape[0])[:, None]
    return jnp.where(rows < total, out, jnp.zeros((), out.dtype))


def pad_to(x, multiples):
    return jnp.pad(x, [(0, -n % m) for n, m in zip(x.shape, multiples, strict=True)])


def spec(lhs, rhs, group_sizes, **options) -> str:
    return spec_key({"lhs": lhs, "rhs": rhs}, {"out": options.get("preferred_element_type")})


def example(dims: dict[str, int], dtype: str = "bfloat16", seed: int = 0):
    m, k = dims.get("m", 8192), dims.get("k", 2048)
    n, g = dims.get("n", 1024), dims.get("groups", 8)
    kl, kr, kg = jax.random.split(jax.random.key(seed), 3)
    lhs = jax.random.normal(kl, (m, k), dtype)
    rhs = jax.random.normal(kr, (g, k, n), dtype) / k**0.5
    cuts = jnp.sort(jax.random.randint(kg, (g - 1,), 0, m + 1))
    sizes = jnp.diff(jnp.concatenate([jnp.array([0]), cuts, jnp.array([m])])).astype(jnp.int32)
    return (lhs, rhs, sizes), {}


def timed(fn):
    def loss(lhs, rhs, group_sizes):
        return jnp.sum(fn(lhs, rhs, group_sizes).astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1))
