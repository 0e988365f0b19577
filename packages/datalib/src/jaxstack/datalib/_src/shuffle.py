"""Global per-epoch shuffle and process sharding of a random-access dataset, in one index map.

Grain shards a source and then shuffles inside each shard, so a process sees the same documents
every epoch. `ShuffleShardMapDataset` instead permutes the whole source with a seed that depends
on the epoch and deals the permutation out round-robin: in epoch e, shard s reads positions s,
s + k, s + 2k, ... of permutation e.

Sources of up to `TABLE_LIMIT` documents get their epoch's permutation as a table (4 bytes a
document, built once an epoch from PCG64's raw stream, which NumPy keeps stable across
versions): Grain's `index_shuffle` costs more the smaller the source (measured on a 2-core AMD
EPYC: 200 us a document at 256 documents, 57 at 1,000, 8 from 65,536 on), which was half of a
small model's SFT step. Larger sources use `index_shuffle` (no table in memory).

All shards together read every document once per epoch, except the last
`len % shard_count` of each permutation (a different few each epoch), so every shard has
exactly `len // shard_count` documents per epoch and no process waits for another.
"""

from __future__ import annotations

import sys

import numpy as np

from jaxstack.datalib._src.errors import ConfigError
from jaxstack.datalib._src.nojax import grain

TABLE_LIMIT = 2**20
"""Sources of at most this many documents are shuffled by a per-epoch table (4 MiB at most)."""


def permutation_table(n: int, seed: int) -> np.ndarray:
    """A permutation of range(n) determined by `seed` alone, on any NumPy version."""
    keys = np.random.PCG64(np.random.SeedSequence(seed)).random_raw(n)
    return np.argsort(keys, kind="stable").astype(np.int32)


class ShuffleShardMapDataset(grain.MapDataset):
    """Epochs of a globally shuffled dataset, restricted to one shard."""

    def __init__(
        self,
        parent: grain.MapDataset,
        *,
        seed: int,
        shard_index: int = 0,
        shard_count: int = 1,
        num_epochs: int | None = None,
        shuffle: bool = True,
    ):
        super().__init__(parent)
        if shard_count < 1 or not 0 <= shard_index < shard_count:
            raise ConfigError(
                f"shard_index={shard_index}, shard_count={shard_count}: need "
                "0 <= shard_index < shard_count (use the process index and count)"
            )
        if num_epochs is not None and num_epochs < 1:
            raise ConfigError(f"num_epochs={num_epochs}; use a positive count or None (forever)")
        if not 0 <= seed < 2**32:
            raise ConfigError(f"seed={seed}; use an integer in [0, 2**32)")
        self._n = len(parent)
        self._per_epoch = self._n // shard_count
        if self._per_epoch == 0:
            raise ConfigError(
                f"{self._n} documents cannot be shared by {shard_count} shards; "
                "use fewer shards or more data"
            )
        self._seed = seed
        self._shard_index = shard_index
        self._shard_count = shard_count
        self._shuffle = shuffle
        self._tables: dict[int, np.ndarray] = {}  # epoch -> permutation, the last two epochs
        self._length = sys.maxsize if num_epochs is None else self._per_epoch * num_epochs

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return (
            f"ShuffleShardMapDataset(shard={self._shard_index}/{self._shard_count}, "
            f"shuffle={self._shuffle})"
        )

    def source_index(self, index: int) -> int:
        """Which parent element the `index`-th element of this shard is."""
        epoch, j = divmod(index, self._per_epoch)
        position = j * self._shard_count + self._shard_index
        if not self._shuffle:
            return position
        seed = (self._seed + epoch) % 2**32
        if self._n > TABLE_LIMIT:
            shuffled = grain.experimental.index_shuffle
            return int(shuffled(position, max_index=self._n - 1, seed=seed, rounds=4))
        table = self._tables.get(epoch)
        if table is None:
            table = self._tables[epoch] = permutation_table(self._n, seed)
            self._tables.pop(epoch - 2, None)
        return int(table[position])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        if index >= self._length:
            raise IndexError(f"index {index} past the end ({self._length})")
        return self._parent[self.source_index(index)]
