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

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.datalib, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.bpe": ["BPETokenizer"],
        "_src.chat": ["ChatTemplate"],
        "_src.columnar": ["ArrayRecordSource", "ParquetSource", "write_array_record"],
        "_src.corpus": ["VALIDATION_PERCENT", "DefaultCorpus", "default_corpus"],
        "_src.errors": [
            "ConfigError",
            "EmptySourceError",
            "Error",
            "SourceError",
            "StateError",
            "TokenizerError",
        ],
        "_src.iterator": ["LMBatchIterator"],
        "_src.mixture": ["mixture"],
        "_src.packing_methods": ["PACKING_METHODS"],
        "_src.pack": ["pack", "rows_to_batch"],
        "_src.pipeline": ["lm_batches", "lm_dataset"],
        "_src.shuffle": ["ShuffleShardMapDataset"],
        "_src.sources": ["InMemorySource", "JsonlSource", "TextSource"],
        "_src.stats": ["packing_efficiency"],
        "_src.tokenize": ["SplitLongExamples", "split_long_examples", "tokenize"],
        "_src.tokenizer": ["ByteTokenizer", "Tokenizer", "tokenize_text"],
    },
)
