"""`lm_batches`: the whole path from a document source to training batches, as a Grain pipeline.

    source -> ShuffleShardMapDataset (global shuffle by seed+epoch, shard by process)
           -> tokenize (bos/eos, per-document target shift)         [MapDataset, random access]
           -> to_iter_dataset(FAST_READ_OPTIONS)
           -> pack (first_fit | concat | pad) -> batch -> rows_to_batch
           -> mp_prefetch (num_workers > 0)                          [IterDataset, stateful]

Every stage is Grain's or a Grain dataset subclass, so `get_state`/`set_state` are Grain's own,
exact mid-epoch, with or without worker processes; `LMBatchIterator` (iterator.py) makes that
state a versioned JSON dict tied to the pipeline's configuration.
"""

from __future__ import annotations

from typing import Any

from jaxstack.datalib._src import workers
from jaxstack.datalib._src.errors import ConfigError, EmptySourceError
from jaxstack.datalib._src.iterator import LMBatchIterator
from jaxstack.datalib._src.nojax import grain
from jaxstack.datalib._src.pack import DEFAULT_PACKING_BINS, pack, rows_to_batch
from jaxstack.datalib._src.shuffle import ShuffleShardMapDataset
from jaxstack.datalib._src.tokenize import tokenize
from jaxstack.datalib._src.tokenizer import ByteTokenizer, Tokenizer


def as_map_dataset(source: Any) -> grain.MapDataset:
    """A Grain MapDataset over any random-access source (a MapDataset passes through)."""
    if isinstance(source, grain.MapDataset):
        dataset = source
    elif hasattr(source, "__len__") and hasattr(source, "__getitem__"):
        dataset = grain.MapDataset.source(source)
    else:
        raise ConfigError(
            f"source {type(source).__name__} is not random-access (needs __len__ and "
            "__getitem__); wrap streams in InMemorySource or write them to JSONL/ArrayRecord"
        )
    if len(dataset) == 0:
        raise EmptySourceError(f"source {source!r} holds no documents")
    return dataset


def lm_dataset(
    source: Any,
    tokenizer: Tokenizer | None = None,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    shard_index: int = 0,
    shard_count: int = 1,
    num_workers: int = 0,
    packing: str = "first_fit",
    num_epochs: int | None = None,
    shuffle: bool = True,
    num_packing_bins: int = DEFAULT_PACKING_BINS,
    add_bos: bool = True,
    add_eos: bool = True,
    read_options: grain.ReadOptions | None = None,
    worker_buffer_size: int = workers.DEFAULT_WORKER_BUFFER,
) -> grain.IterDataset:
    """The `lm_batches` pipeline as a Grain `IterDataset` (to extend before iterating)."""
    tokenizer = tokenizer or ByteTokenizer()
    if not isinstance(tokenizer, Tokenizer):
        raise ConfigError(
            f"tokenizer {type(tokenizer).__name__} lacks the Tokenizer protocol (encode, decode, "
            "vocab_size, bos_id, eos_id, pad_id); use ByteTokenizer() or BPETokenizer"
        )
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size}; use a positive batch size")
    if num_workers < 0:
        raise ConfigError(f"num_workers={num_workers}; use 0 (in-process) or more")
    docs = ShuffleShardMapDataset(
        as_map_dataset(source),
        seed=seed,
        shard_index=shard_index,
        shard_count=shard_count,
        num_epochs=num_epochs,
        shuffle=shuffle,
    )
    examples = tokenize(docs, tokenizer, add_bos=add_bos, add_eos=add_eos)
    rows = pack(
        examples.to_iter_dataset(read_options or workers.FAST_READ_OPTIONS),
        seq_len,
        method=packing,
        num_packing_bins=num_packing_bins,
        seed=seed,
        shuffle_bins=shuffle,
    )
    batches = rows.batch(batch_size, drop_remainder=True).map(rows_to_batch(tokenizer.pad_id))
    if num_workers > 0:
        batches = workers.in_workers(batches, num_workers, worker_buffer_size)
    return batches


def lm_batches(
    source: Any,
    tokenizer: Tokenizer | None = None,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    shard_index: int = 0,
    shard_count: int = 1,
    num_workers: int = 0,
    packing: str = "first_fit",
    num_epochs: int | None = None,
    shuffle: bool = True,
    num_packing_bins: int = DEFAULT_PACKING_BINS,
    add_bos: bool = True,
    add_eos: bool = True,
    read_options: grain.ReadOptions | None = None,
    worker_buffer_size: int = workers.DEFAULT_WORKER_BUFFER,
) -> LMBatchIterator:
    """Batches for language-model training from a random-access source of documents.

    Args:
      source: anything with `__len__`/`__getitem__` giving documents (str, or
        {"tokens", "loss_mask"?} dicts), e.g. `default_corpus("train")`, a `JsonlSource`, or a
        `grain.MapDataset` you already filtered/mapped (None elements are dropped).
      tokenizer: a `Tokenizer`; default `ByteTokenizer()`.
      seq_len, batch_size: every batch array is [batch_size, seq_len]; a final partial batch
        is dropped.
      seed: drives the per-epoch document shuffle (seed + epoch) and the bin shuffle.
      shard_index, shard_count: this process's share (e.g. jax.process_index()/count()).
      num_workers: 0 = in-process; N > 0 = N Grain worker processes, each running the whole
        pipeline on every N-th document (batches differ from N = 0 but are deterministic).
      packing: "first_fit" (default), "concat" or "pad"; see `pack`.
      num_epochs: passes over the data; None = forever.
      shuffle: shuffle documents per epoch and rows within packing groups.
      num_packing_bins: open rows for first-fit packing (more = less padding, more memory).
      add_bos, add_eos: wrap text documents in the tokenizer's bos/eos.
      read_options: Grain ReadOptions for the random-access stage (default: in-thread, which
        measured fastest on small hosts).
      worker_buffer_size: batches buffered per worker process.

    Returns:
      An `LMBatchIterator` yielding {"tokens", "targets", "segment_ids", "positions": int32,
      "loss_mask": float32}, each [batch_size, seq_len], with JSON `get_state`/`set_state`.
    """
    dataset = lm_dataset(
        source,
        tokenizer,
        seq_len=seq_len,
        batch_size=batch_size,
        seed=seed,
        shard_index=shard_index,
        shard_count=shard_count,
        num_workers=num_workers,
        packing=packing,
        num_epochs=num_epochs,
        shuffle=shuffle,
        num_packing_bins=num_packing_bins,
        add_bos=add_bos,
        add_eos=add_eos,
        read_options=read_options,
        worker_buffer_size=worker_buffer_size,
    )
    tok = tokenizer or ByteTokenizer()
    config = dict(
        # Names and sizes only: reprs may hold memory addresses, which differ after a restart.
        tokenizer=f"{type(tok).__name__}(vocab_size={tok.vocab_size}, eos_id={tok.eos_id})",
        source=f"{type(source).__name__}[{len(source)}]",
        seq_len=seq_len,
        batch_size=batch_size,
        seed=seed,
        shard_index=shard_index,
        shard_count=shard_count,
        num_workers=num_workers,
        packing=packing,
        num_epochs=num_epochs,
        shuffle=shuffle,
        num_packing_bins=num_packing_bins,
        add_bos=add_bos,
        add_eos=add_eos,
    )
    return LMBatchIterator(dataset, config)
