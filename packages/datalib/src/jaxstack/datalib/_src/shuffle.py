"""Global per-epoch shuffle and process sharding of a random-access dataset, in one index map.

Grain shards a source and then shuffles inside each shard, so a process sees the same documents
every epoch. `ShuffleShardMapDataset` instead permutes the whole source with a seed that depends
on the epoch (`seed + epoch`, Grain's `index_shuffle`, no index table in memory) and deals the
permutation out round-robin: in epoch e, shard s reads positions s, s + k, s + 2k, ... of
permutation e. All shards together read every document once per epoch, except the last
`len % shard_count` of each permutation (a different few each epoch), so every shard has
exactly `len // shard_count` documents per epoch and no process waits for another.
"""

from __future__ import annotations

import sys

from jaxstack.datalib._src.errors import ConfigError
from jaxstack.datalib._src.nojax import grain


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
        return int(
            grain.experimental.index_shuffle(
                position, max_index=self._n - 1, seed=(self._seed + epoch) % 2**32, rounds=4
            )
        )

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        if index >= self._length:
            raise IndexError(f"index {index} past the end ({self._length})")
        return self._parent[self.source_index(index)]
