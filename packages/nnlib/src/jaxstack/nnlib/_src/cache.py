"""KV caches for decoding: the interface the model talks to, and a contiguous implementation.

The model never indexes a cache itself. Per layer it calls

    out, cache = cache.attend(layer, q, k, v, positions=..., segment_ids=..., ...)

which stores this call's k/v for `layer` and returns attention of q over everything cached so
far plus the new tokens; after the last layer it calls `cache = cache.advance(positions,
segment_ids)` once to commit the new tokens. A paged cache (serving) implements the same two
methods over its block table; `layer` may be a traced int32 scalar when layers are scanned.
Caches are PyTrees, so they pass through jax.jit and lax.scan as carries.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from jaxstack.nnlib._src.attention_fn import attention_mask, masked_attention
from jaxstack.nnlib._src.errors import CacheError


@runtime_checkable
class KVCache(Protocol):
    """What a decode cache must provide (see the module docstring)."""

    def attend(
        self,
        layer: int | jax.Array,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        *,
        positions: jax.Array,
        segment_ids: jax.Array,
        sliding_window: int | None,
        logits_soft_cap: float | None,
        scale: float,
    ) -> tuple[jax.Array, KVCache]: ...

    def advance(self, positions: jax.Array, segment_ids: jax.Array) -> KVCache: ...


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ContiguousKVCache:
    """One [max_len] slot row per batch element; all rows advance together.

    Fields: k, v [layers, B, max_len, kv_heads, head_dim]; positions [B, max_len] (position of
    the token in each slot); segment_ids [B, max_len] (0 = empty slot or padding, so never
    attended); length: int32 scalar, number of committed slots.
    """

    k: jax.Array
    v: jax.Array
    positions: jax.Array
    segment_ids: jax.Array
    length: jax.Array

    @classmethod
    def create(cls, config, batch_size: int, max_len: int, dtype=None) -> ContiguousKVCache:
        """An empty cache for `config` (a ModelConfig); dtype defaults to the compute dtype."""
        from jaxstack.nnlib._src.config import dtype_of

        dtype = dtype_of(config.dtype) if dtype is None else dtype
        shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            positions=jnp.zeros((batch_size, max_len), jnp.int32),
            segment_ids=jnp.zeros((batch_size, max_len), jnp.int32),
            length=jnp.zeros((), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def attend(
        self, layer, q, k, v, *, positions, segment_ids, sliding_window, logits_soft_cap, scale
    ):
        t = q.shape[1]
        if t > self.max_len:
            raise CacheError(f"{t} new tokens do not fit a cache of max_len={self.max_len}")
        start = (layer, 0, self.length, 0, 0)
        new_k = jax.lax.dynamic_update_slice(self.k, k.astype(self.k.dtype)[None], start)
        new_v = jax.lax.dynamic_update_slice(self.v, v.astype(self.v.dtype)[None], start)
        all_pos = jax.lax.dynamic_update_slice(
            self.positions, positions.astype(jnp.int32), (0, self.length)
        )
        all_seg = jax.lax.dynamic_update_slice(
            self.segment_ids, segment_ids.astype(jnp.int32), (0, self.length)
        )
        mask = attention_mask(
            positions, all_pos, segment_ids, all_seg, causal=True, sliding_window=sliding_window
        )
        layer_k = jax.lax.dynamic_index_in_dim(new_k, layer, 0, keepdims=False)
        layer_v = jax.lax.dynamic_index_in_dim(new_v, layer, 0, keepdims=False)
        out = masked_attention(
            q,
            layer_k.astype(q.dtype),
            layer_v.astype(q.dtype),
            mask,
            logits_soft_cap=logits_soft_cap,
            scale=scale,
        )
        return out, dataclasses.replace(self, k=new_k, v=new_v)

    def advance(self, positions, segment_ids):
        t = positions.shape[1]
        pos = jax.lax.dynamic_update_slice(
            self.positions, positions.astype(jnp.int32), (0, self.length)
        )
        seg = jax.lax.dynamic_update_slice(
            self.segment_ids, segment_ids.astype(jnp.int32), (0, self.length)
        )
        return dataclasses.replace(self, positions=pos, segment_ids=seg, length=self.length + t)
