"""Documents to language-model examples: tokenize, add bos/eos, shift targets, split long ones.

An LM example is one int32 array `lm` of shape [n, 3] whose columns are (token, target,
learn): `target[i]` is the document's next token after `token[i]`, so the next-token shift is
done per document, before packing, and can never cross into another document. `learn` is 1
where the target is to be predicted (0 for chat prompts, see `ChatTemplate.encode`). Keeping the
three in one array lets Grain's packers move them together as a single feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstack.datalib._src.errors import ConfigError
from jaxstack.datalib._src.nojax import grain
from jaxstack.datalib._src.tokenizer import Tokenizer, tokenize_text

TOKEN, TARGET, LEARN = 0, 1, 2


def document_to_example(
    document: Any, tokenizer: Tokenizer, *, add_bos: bool = True, add_eos: bool = True
) -> np.ndarray | None:
    """One document (str, bytes, or {"tokens", "loss_mask"?}) as an LM example, or None.

    Text gets `bos_id` (when the tokenizer has one and `add_bos`) and `eos_id` around it;
    pre-tokenized dicts are used as they are. Documents that give fewer than two tokens have no
    next-token target and return None (Grain drops Nones).
    """
    if document is None:
        return None
    if isinstance(document, dict):
        if "tokens" not in document:
            raise ConfigError(
                f"a dict document needs a 'tokens' array (got keys {sorted(document)}); map "
                "text records to str first, e.g. JsonlSource(field='text')"
            )
        ids = np.asarray(document["tokens"], dtype=np.int32)
        learn = np.asarray(document.get("loss_mask", np.ones(len(ids))), dtype=np.int32)
    else:
        if isinstance(document, bytes):
            document = document.decode("utf-8", errors="replace")
        if not isinstance(document, str):
            raise ConfigError(
                f"documents must be str or {{'tokens': ...}} dicts, got {type(document).__name__}"
            )
        body = tokenize_text(tokenizer, document)
        head = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
        tail = [tokenizer.eos_id] if add_eos else []
        ids = np.concatenate([np.asarray(head, np.int32), body, np.asarray(tail, np.int32)])
        learn = np.ones(len(ids), np.int32)
    if len(ids) < 2:
        return None
    example = np.empty((len(ids) - 1, 3), np.int32)
    example[:, TOKEN] = ids[:-1]
    example[:, TARGET] = ids[1:]
    example[:, LEARN] = learn[1:]
    return example


def tokenize(
    dataset: grain.MapDataset, tokenizer: Tokenizer, *, add_bos: bool = True, add_eos: bool = True
) -> grain.MapDataset:
    """`dataset.map` of `document_to_example` into {"lm": int32 [n, 3]} elements."""

    def to_example(document):
        example = document_to_example(document, tokenizer, add_bos=add_bos, add_eos=add_eos)
        return None if example is None else {"lm": example}

    return dataset.map(to_example)


class SplitLongExamples(grain.experimental.FlatMapTransform):
    """Cut an example into pieces of at most `max_len` rows (each piece becomes a segment).

    Because targets were shifted before the cut, the last target of a piece is still the true
    next token (the first token of the following piece): nothing is lost at the seams.
    """

    def __init__(self, max_len: int, max_fan_out: int = 1 << 20):
        self.max_len = max_len
        self.max_fan_out = max_fan_out

    def flat_map(self, element: dict[str, np.ndarray]) -> Sequence[dict[str, np.ndarray]]:
        lm = element["lm"]
        if len(lm) <= self.max_len:
            return [element]
        return [{"lm": lm[i : i + self.max_len]} for i in range(0, len(lm), self.max_len)]


def split_long_examples(dataset: grain.IterDataset, max_len: int) -> grain.IterDataset:
    """Grain's `FlatMapIterDataset` with `SplitLongExamples` (checkpointable mid-document)."""
    return grain.experimental.FlatMapIterDataset(dataset, SplitLongExamples(max_len))
