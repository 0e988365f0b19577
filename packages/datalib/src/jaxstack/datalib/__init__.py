"""Deterministic, checkpointable input pipelines on Grain (no JAX dependency).

Sources give documents by index, tokenizers turn them into ids, and Grain datasets with a few
added transformations (global shuffle and sharding, tokenize with per-document target shift,
first-fit/concat/pad packing) turn them into the batch dict of the project's conventions:

    import jaxstack.datalib as dl

    with dl.lm_batches(dl.default_corpus("train"), dl.ByteTokenizer(),
                       seq_len=256, batch_size=8, seed=0) as it:
        batch = next(it)            # tokens/targets/segment_ids/positions int32, loss_mask f32
        state = it.get_state()      # small JSON dict; it.set_state(state) resumes exactly
"""

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.datalib, or a command's --help, does not import JAX.
_EXPORTS = {
    "BPETokenizer": "bpe",
    "ChatTemplate": "chat",
    "ArrayRecordSource": "columnar",
    "ParquetSource": "columnar",
    "write_array_record": "columnar",
    "VALIDATION_PERCENT": "corpus",
    "DefaultCorpus": "corpus",
    "default_corpus": "corpus",
    "ConfigError": "errors",
    "EmptySourceError": "errors",
    "Error": "errors",
    "SourceError": "errors",
    "StateError": "errors",
    "TokenizerError": "errors",
    "LMBatchIterator": "iterator",
    "mixture": "mixture",
    "PACKING_METHODS": "packing_methods",
    "pack": "pack",
    "rows_to_batch": "pack",
    "lm_batches": "pipeline",
    "lm_dataset": "pipeline",
    "ShuffleShardMapDataset": "shuffle",
    "InMemorySource": "sources",
    "JsonlSource": "sources",
    "TextSource": "sources",
    "packing_efficiency": "stats",
    "SplitLongExamples": "tokenize",
    "split_long_examples": "tokenize",
    "tokenize": "tokenize",
    "ByteTokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "tokenize_text": "tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}._src.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
