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

from jaxstack.datalib._src import nojax as _nojax

_nojax.import_grain_without_jax()

from jaxstack.datalib._src.bpe import BPETokenizer  # noqa: E402
from jaxstack.datalib._src.chat import ChatTemplate  # noqa: E402
from jaxstack.datalib._src.columnar import ArrayRecordSource, ParquetSource, write_array_record  # noqa: E402
from jaxstack.datalib._src.corpus import VALIDATION_PERCENT, DefaultCorpus, default_corpus  # noqa: E402
from jaxstack.datalib._src.errors import (  # noqa: E402
    ConfigError,
    EmptySourceError,
    Error,
    SourceError,
    StateError,
    TokenizerError,
)
from jaxstack.datalib._src.iterator import LMBatchIterator  # noqa: E402
from jaxstack.datalib._src.mixture import mixture  # noqa: E402
from jaxstack.datalib._src.pack import PACKING_METHODS, pack, rows_to_batch  # noqa: E402
from jaxstack.datalib._src.pipeline import lm_batches, lm_dataset  # noqa: E402
from jaxstack.datalib._src.shuffle import ShuffleShardMapDataset  # noqa: E402
from jaxstack.datalib._src.sources import InMemorySource, JsonlSource, TextSource  # noqa: E402
from jaxstack.datalib._src.stats import packing_efficiency  # noqa: E402
from jaxstack.datalib._src.tokenize import SplitLongExamples, split_long_examples, tokenize  # noqa: E402
from jaxstack.datalib._src.tokenizer import ByteTokenizer, Tokenizer, tokenize_text  # noqa: E402

__all__ = [
    "PACKING_METHODS",
    "VALIDATION_PERCENT",
    "ArrayRecordSource",
    "BPETokenizer",
    "ByteTokenizer",
    "ChatTemplate",
    "ConfigError",
    "DefaultCorpus",
    "EmptySourceError",
    "Error",
    "InMemorySource",
    "JsonlSource",
    "LMBatchIterator",
    "ParquetSource",
    "ShuffleShardMapDataset",
    "SourceError",
    "SplitLongExamples",
    "StateError",
    "TextSource",
    "Tokenizer",
    "TokenizerError",
    "default_corpus",
    "lm_batches",
    "lm_dataset",
    "mixture",
    "pack",
    "packing_efficiency",
    "rows_to_batch",
    "split_long_examples",
    "tokenize",
    "tokenize_text",
    "write_array_record",
]
