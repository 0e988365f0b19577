"""The paged KV cache as nnlib's `KVCache`: the model runs on it unchanged.

nnlib's attention layer calls `cache.attend(layer, q, k, v, ...)` per layer and
`cache.advance(...)` once after the last layer. Here the whole step is one flat row of tokens
(`q` is [1, T, heads, head_dim]: every sequence's prefill chunk or decode token, concatenated),
so `attend` writes the new keys and values into their slots (`slot_mapping`: block id *
block_size + offset, from the block tables) and runs kernlib's `ragged_paged_attention` over
the layer's pages. The cache has one of kernlib's two layouts (`kv_layout`):

- "head_major" (on CPU): [kv_heads, layers, num_blocks * block_size, head_dim], a free
  reshape of the [kv_heads, layers * num_blocks, block_size, head_dim] pages the kernel reads.
  kernlib's CPU custom call (its default there) reads each page of a kv head as one
  contiguous block; its XLA implementation (the fallback without a C++ compiler) gathers
  pages in the order its attention matmuls read them, with no transposed copy of every key
  and value read (half the op time of a small model's decode step, page-major).
- "page_major" (on GPU and TPU, where the Pallas kernels read vLLM's layout): [layers,
  num_blocks * block_size, kv_heads, head_dim], a free reshape of [layers * num_blocks,
  block_size, kv_heads, head_dim] pages.

Either way layer l's pages are l * num_blocks + its block ids in that array of every layer's
pages, so the kernel reads the cache where it lies (`cache[layer]` would be a slice that XLA
copies out: a whole layer's cache per layer and step), and the write is one scatter (in
place: the engine donates the cache). Nothing in a step is proportional to the cache's
capacity: the kernel reads the pages of the live tokens only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxstack import kernlib

# Loaded now, not inside the first step's trace: loading the kernel's modules registers JAX
# options that are part of jit's cache key, so the program traced first would never be hit
# again and its step shape would compile twice (once at warm-up, once serving).
ragged_paged_attention = kernlib.ragged_paged_attention

PAGE_MAJOR, HEAD_MAJOR = "page_major", "head_major"


def default_kv_layout() -> str:
    """Head-major where kernlib runs its CPU custom call or XLA implementation (CPU),
    page-major where its Pallas kernels do (GPU, TPU: they read page-major only)."""
    return HEAD_MAJOR if jax.default_backend() == "cpu" else PAGE_MAJOR


def copy_blocks(k, v, source, destination, *, block_size: int, kv_layout: str):
    """k and v with each block `source[i]` copied into block `destination[i]`, in every layer
    and head (a request's forks get its prompt's last, partial block this way). Pairs of the
    null block pad the arrays to a fixed size."""
    offsets = jnp.arange(block_size)
    read = (source[:, None] * block_size + offsets).reshape(-1)
    write = (destination[:, None] * block_size + offsets).reshape(-1)
    slots = (slice(None), slice(None)) if kv_layout == HEAD_MAJOR else (slice(None),)
    return tuple(c.at[(*slots, write)].set(c[(*slots, read)]) for c in (k, v))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
    k: jax.Array
    v: jax.Array
    slot_mapping: jax.Array  # [T] int32; padding rows write to the null block's slots
    kv_lens: jax.Array  # [S] tokens in each sequence's cache after this step
    block_tables: jax.Array  # [S, blocks_per_seq]
    query_start_loc: jax.Array  # [S + 1]
    num_seqs: jax.Array  # [] live sequences; the rest are padding
    block_size: int = dataclasses.field(metadata=dict(static=True), default=16)
    kv_layout: str = dataclasses.field(metadata=dict(static=True), default=PAGE_MAJOR)

    @staticmethod
    def zeros(
        config, num_blocks: int, block_size: int, dtype, kv_layout: str = PAGE_MAJOR
    ) -> tuple[jax.Array, jax.Array]:
        """Empty k and v arrays for an nnlib ModelConfig, in the layout `kv_layout`."""
        layers, slots = config.num_layers, num_blocks * block_size
        heads, dim = config.num_kv_heads, config.head_dim
        if kv_layout == HEAD_MAJOR:
            shape = (heads, layers, slots, dim)
        else:
            shape = (layers, slots, heads, dim)
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def attend(
        self, layer, q, k, v, *, positions, segment_ids, sliding_window, logits_soft_cap, scale
    ):
        del positions, segment_ids  # the block tables and query_start_loc carry both
        k, v = k[0].astype(self.k.dtype), v[0].astype(self.v.dtype)  # [T, kv_heads, head_dim]
        if self.kv_layout == HEAD_MAJOR:
            kv_heads, layers, slots, head_dim = self.k.shape
            new_k = self.k.at[:, layer, self.slot_mapping].set(k.swapaxes(0, 1))
            new_v = self.v.at[:, layer, self.slot_mapping].set(v.swapaxes(0, 1))
            pages = (kv_heads, layers * (slots // self.block_size), self.block_size, head_dim)
        else:
            layers, slots, kv_heads, head_dim = self.k.shape
            new_k = self.k.at[layer, self.slot_mapping].set(k)
            new_v = self.v.at[layer, self.slot_mapping].set(v)
            pages = (layers * (slots // self.block_size), self.block_size, kv_heads, head_dim)
        num_pages = slots // self.block_size
        out = ragged_paged_attention(
            q[0],
            new_k.reshape(pages),
            new_v.reshape(pages),
            self.kv_lens,
            self.block_tables + layer * num_pages,
            self.query_start_loc,
            self.num_seqs,
            scale=scale,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            kv_layout=self.kv_layout,
        )
        return out[None], dataclasses.replace(self, k=new_k, v=new_v)

    def advance(self, positions, segment_ids):
        return self
