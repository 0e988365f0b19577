"""The paged KV cache's bookkeeping: fixed-size blocks, a free list, and the prefix cache.

The cache holds `num_blocks` blocks of `block_size` token slots each (block 0 is a null block
that padding rows write into and no sequence owns). A sequence owns a list of block ids, its
block table, that grows as its tokens are computed.

Prefix caching: once a block is full, it is keyed by a hash of its tokens and of the block
before it (so a key names the whole prefix, not just 16 tokens), the first block's by the
sequence's LoRA adapter. A new sequence whose prompt
starts with cached blocks takes them instead of recomputing them; each block counts its
owners. A block nobody owns goes to the back of the free list but keeps its key, so it can
still be hit until it is reused: allocation takes from the front, which evicts the least
recently used cached blocks first.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence as Seq

from jaxstack.serving._src.llm.sequence import Sequence

NULL_BLOCK = 0


def block_hash(parent: int | tuple | None, tokens: Seq[int]) -> int:
    return hash((parent, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.hash_of: dict[int, int] = {}  # block id -> key, for cached blocks
        self.cached: dict[int, int] = {}  # key -> block id
        # Unowned blocks, least recently freed first (dict order; values unused).
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict(
            (b, None) for b in range(1, num_blocks)
        )
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found cached

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - 1 - len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def update_hashes(self, seq: Sequence) -> None:
        """Extend `seq.block_hashes` over its full blocks of known tokens."""
        tokens, bs = seq.token_ids, self.block_size
        for j in range(len(seq.block_hashes), len(tokens) // bs):
            # The first block's parent is the adapter: the same tokens under another adapter
            # have other keys and values, so they never share cached blocks.
            first = ("lora", seq.adapter) if seq.adapter else None
            parent = seq.block_hashes[-1] if seq.block_hashes else first
            seq.block_hashes.append(block_hash(parent, tokens[j * bs : (j + 1) * bs]))

    def take_cached_prefix(self, seq: Sequence) -> int:
        """Give a new sequence the cached blocks of its prompt's prefix; returns tokens reused.

        At least one token is always left to compute: its logits start generation.
        """
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return 0
        self.update_hashes(seq)
        usable = (seq.num_tokens - 1) // self.block_size
        for key in seq.block_hashes[:usable]:
            block = self.cached.get(key)
            if block is None:
                break
            self._own(block)
            seq.block_ids.append(block)
        hit = len(seq.block_ids) * self.block_size
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += hit
        return hit

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Make `seq` own enough blocks for `num_tokens` tokens; False (nothing taken) if the
        free list is too short."""
        need = self.blocks_needed(num_tokens) - len(seq.block_ids)
        if need > len(self.free):
            return False
        for _ in range(need):
            block, _ = self.free.popitem(last=False)
            key = self.hash_of.pop(block, None)
            if key is not None:
                del self.cached[key]
            self.ref_counts[block] = 1
            seq.block_ids.append(block)
        return True

    def fork(self, child: Sequence, parent: Sequence, num_tokens: int) -> bool:
        """Give `child` the KV of `parent`'s first `num_tokens` tokens: their full blocks
        shared (each counts both owners), and a fresh block of its own for a partly filled
        last one (the runner copies it on device: `model_runner.fork_copy`). False (nothing
        taken) when no block is free for that copy."""
        full, partial = divmod(num_tokens, self.block_size)
        if partial and not self.free:
            return False
        for block in parent.block_ids[:full]:
            self._own(block)
            child.block_ids.append(block)
        return self.allocate(child, num_tokens)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Key the blocks of `seq` that are now completely computed (once each: a sequence
        counts its blocks keyed so far, so a token that fills no block costs a comparison)."""
        if not self.enable_prefix_caching:
            return
        # A token still on the device (async scheduling) is computed but not yet known.
        full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        keyed = seq.num_keyed_blocks
        if full <= keyed:  # most tokens fill no block: nothing to hash or look up
            return
        self.update_hashes(seq)
        for block, key in zip(seq.block_ids[keyed:full], seq.block_hashes[keyed:full], strict=True):
            if block not in self.hash_of and key not in self.cached:
                self.hash_of[block] = key
                self.cached[key] = block
        seq.num_keyed_blocks = full

    def release(self, seq: Sequence) -> None:
        """Drop `seq`'s ownership; its tail blocks are freed first so that they are evicted
        before the prefix blocks that other prompts are likelier to share."""
        for block in reversed(seq.block_ids):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None
        seq.block_ids = []
        seq.num_keyed_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached key (new weights make the cached KV wrong)."""
        self.hash_of.clear()
        self.cached.clear()

    def _own(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free[block]
        self.ref_counts[block] += 1
