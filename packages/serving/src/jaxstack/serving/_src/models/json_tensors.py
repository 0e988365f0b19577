"""The `data` arrays of KServe v2 JSON requests, read in bounded memory.

Parsing a whole request with `orjson.loads` turns every number of every tensor into a Python
object (a float is 24 bytes plus an 8-byte list slot), so a 60 MB body of short numbers grew the
server by over a gigabyte before NumPy saw it. Here the `data` array of each `inputs[i]` is
first located without parsing it (`split_body`: a regex pass over the bytes that give JSON its
structure: brackets, braces and quotes); the rest of the document, with `null` in their place,
is small and parsed whole. Each array is then checked for the kinds of value it holds (regex
searches over its bytes) and read straight into its NumPy array a slice at a time
(`read_data`): orjson parses about `CHUNK_BYTES` of text, NumPy copies it in, so the peak is the
body, the decoded tensors and one slice's Python objects.

A data array holds numbers (booleans for BOOL), flat or nested; as in Triton, nesting is read
row-major and only the element count must match the shape. An array mixing kinds of value
(numbers with booleans, strings or nulls) is refused before anything is parsed, naming them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import orjson

from jaxstack.serving._src.errors import InvalidInputError

CHUNK_BYTES = 1 << 17

_STRUCTURE = re.compile(rb'[\[\]{}"]')
_STRING_REST = re.compile(rb'(?:[^"\\]|\\.)*"', re.S)
_KEY_SEPARATOR = re.compile(rb"\s*:\s*")
_OPENING = {ord("]"): ord("["), ord("}"): ord("{")}
_QUOTE, _ARRAY, _OBJECT = ord('"'), ord("["), ord("{")
# Nested rows read row-major: brackets become blanks, so `[[1,2],[3,4]]` reads as `1,2,3,4`
# while a missing comma (`[1,2][3,4]`) still fails to parse.
_BRACKETS_AS_BLANKS = bytes.maketrans(b"[]", b"  ")

_KINDS = {
    "numbers": tuple(str(digit).encode() for digit in range(10)),
    "booleans": (b"true", b"false"),
    "nulls": (b"null",),
}


@dataclass(frozen=True)
class Span:
    """`body[start:end]` is one whole `inputs[i].data` array, brackets included."""

    body: bytes
    start: int
    end: int


def split_body(body: bytes) -> tuple[bytes, dict[int, Span]]:
    """The document with `null` for each `inputs[i].data` array, and where those arrays are.

    Only the structure is checked here; orjson checks the rest when it parses the result.
    """
    spans: dict[int, Span] = {}
    open_: list[tuple[int, bytes | None]] = []  # (bracket, the key it is the value of)
    tensor, inputs_seen = -1, False
    key, key_end, pos = None, -1, 0
    while match := _STRUCTURE.search(body, pos):
        at = match.start()
        char = body[at]
        if char == _QUOTE:
            key, key_end = body[at + 1 : (pos := _string_end(body, at)) - 1], pos
            continue
        pos = at + 1
        if char in _OPENING:
            if not open_ or open_[-1][0] != _OPENING[char]:
                raise InvalidInputError(f"request body is not valid JSON: unmatched {chr(char)!r}")
            open_.pop()
            continue
        named = key if key_end >= 0 and _KEY_SEPARATOR.fullmatch(body, key_end, at) else None
        key_end = -1
        depth = len(open_)
        in_inputs = depth >= 2 and open_[0][0] == _OBJECT and open_[1] == (_ARRAY, b"inputs")
        if depth == 1 and char == _ARRAY and named == b"inputs" and open_[0][0] == _OBJECT:
            if inputs_seen:
                raise InvalidInputError("request body has two 'inputs' keys; send one list")
            inputs_seen = True
        elif depth == 2 and char == _OBJECT and in_inputs:
            tensor += 1
        elif depth == 3 and char == _ARRAY and named == b"data" and in_inputs:
            pos = _data_end(body, at, tensor)
            spans[tensor] = Span(body, at, pos)
            continue
        open_.append((char, named))
    if open_:
        raise InvalidInputError("request body is not valid JSON: it ends inside an array or object")
    if not spans:
        return body, spans
    parts, previous = [], 0
    for span in spans.values():
        parts += [body[previous : span.start], b"null"]
        previous = span.end
    parts.append(body[previous:])
    return b"".join(parts), spans


def _string_end(body: bytes, at: int) -> int:
    rest = _STRING_REST.match(body, at + 1)
    if rest is None:
        raise InvalidInputError("request body is not valid JSON: unterminated string")
    return rest.end()


def _data_end(body: bytes, at: int, tensor: int) -> int:
    """Where the data array opened at `at` ends (one past its `]`), found with C-speed searches:
    numbers and booleans hold no quote or brace, so the array must close before the first one."""
    found = [i for i in (body.find(c, at) for c in (b'"', b"{", b"}")) if i >= 0]
    limit = min(found, default=len(body))
    close = body.find(b"]", at, limit)
    if close >= 0 and body.find(b"[", at + 1, close) < 0:
        return close + 1
    if close >= 0 and (end := _nested_end(body, at, limit)) is not None:
        return end
    if limit < len(body) and body[limit] in b'"{':
        inside = body[at:limit]
        kinds = ["strings" if body[limit] == _QUOTE else "objects"]
        kinds += [k for k, word in (("booleans", b"true"), ("numbers", b"0")) if word in inside]
        raise InvalidInputError(
            f"inputs[{tensor}].data holds {' and '.join(sorted(kinds))}: send numbers "
            "(booleans for BOOL)"
        )
    raise InvalidInputError("request body is not valid JSON: an inputs data array does not end")


def _nested_end(body: bytes, at: int, limit: int) -> int | None:
    """One past the `]` that closes the `[` at `at`, if before `limit`: the bracket depth is
    counted by NumPy over CHUNK_BYTES of the body at a time."""
    view, depth = np.frombuffer(body, np.uint8), 0
    for start in range(at, limit, CHUNK_BYTES):
        piece = view[start : min(start + CHUNK_BYTES, limit)]
        where = np.flatnonzero((piece == ord("[")) | (piece == ord("]")))
        levels = depth + np.cumsum(np.where(piece[where] == ord("["), 1, -1))
        closed = np.flatnonzero(levels == 0)
        if closed.size:
            return start + int(where[closed[0]]) + 1
        depth = int(levels[-1]) if levels.size else depth
    return None


def read_data(span: Span, shape: list[int], dtype: np.dtype, field: str, datatype: str):
    """The array `span` holds as a `shape` array of `dtype`, refused with a message naming
    `field` when its values are not all `datatype` values or their count does not fit."""
    _check_kinds(span, dtype, field, datatype)
    expected = math.prod(shape)
    out = np.empty(expected, dtype)
    body, end = span.body, span.end - 1
    pos, count = span.start + 1, 0
    while pos < end:
        cut = body.find(b",", min(pos + CHUNK_BYTES, end), end)
        cut = end if cut < 0 else cut
        try:
            values = orjson.loads(b"[" + body[pos:cut].translate(_BRACKETS_AS_BLANKS) + b"]")
        except orjson.JSONDecodeError as e:
            raise InvalidInputError(f"{field}.data is not a list of {datatype} values: {e}") from e
        if count + len(values) <= expected:
            _store(values, out[count : count + len(values)], field, datatype)
        count += len(values)
        pos = cut + 1
    if count != expected:
        raise InvalidInputError(
            f"{field}.data has {count} elements but {field}.shape {shape} needs {expected}"
        )
    return out.reshape(shape)


def _check_kinds(span: Span, dtype: np.dtype, field: str, datatype: str) -> None:
    # split_body let no string or object into a span: what is left to tell apart are numbers,
    # booleans and nulls, each by a spelling the others lack (bytes.find runs at memchr speed).
    body, start, end = span.body, span.start, span.end
    found = {kind for kind, words in _KINDS.items() if _holds(body, start, end, words)}
    allowed = "booleans" if dtype.kind == "b" else "numbers"
    if found <= {allowed}:
        if dtype.kind in "iu" and _holds(body, start, end, (b".", b"e", b"E")):
            raise InvalidInputError(
                f"{field}.data holds non-integer numbers, which are not {datatype} values"
            )
        return
    kinds = sorted(found)
    if len(kinds) == 1:
        raise InvalidInputError(f"{field}.data holds {kinds[0]}, which are not {datatype} values")
    raise InvalidInputError(
        f"{field}.data mixes {', '.join(kinds[:-1])} and {kinds[-1]}; send only {datatype} values"
    )


def _holds(body: bytes, start: int, end: int, words: tuple[bytes, ...]) -> bool:
    return any(body.find(word, start, end) >= 0 for word in words)


def _store(values: list, out: np.ndarray, field: str, datatype: str) -> None:
    if out.dtype.kind in "iu":
        raw = np.asarray(values)
        info = np.iinfo(out.dtype)
        if raw.dtype.kind not in "iu" or (
            raw.size and (raw.min() < info.min or raw.max() > info.max)
        ):
            raise InvalidInputError(f"{field}.data has values out of the range of {datatype}")
        out[...] = raw
        return
    try:
        with np.errstate(over="raise", invalid="raise"):
            out[...] = np.asarray(values, dtype=bool if out.dtype.kind == "b" else np.float64)
    except (OverflowError, FloatingPointError) as e:
        raise InvalidInputError(f"{field}.data does not fit {datatype}: {e}") from e
