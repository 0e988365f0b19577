"""Reading chat, prompt-completion, preference and prompt records from JSON Lines files.

Every record is checked when the file is read, before any model is built, so a bad one is
reported as `path:line: what is wrong` (a `RecordError`) instead of failing mid-run. Formats
follow TRL's dataset formats:

- SFT: `{"messages": [{"role": ..., "content": ...}, ...]}` (conversational, rendered with the
  chat template) or `{"prompt": str, "completion": str}`.
- Preferences (DPO, ORPO): `{"prompt": str | messages, "chosen": str, "rejected": str}`.
- Prompts (GRPO, PPO): `{"prompt": str | messages}`; other keys are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterator
from typing import Any

from jaxstack.rl._src.errors import RecordError

ROLES = ("system", "user", "assistant", "tool")
Messages = list[dict[str, str]]


@dataclasses.dataclass(frozen=True)
class SftRecord:
    """One SFT example: a conversation, or a prompt with its completion."""

    messages: Messages | None = None
    prompt: str | None = None
    completion: str | None = None


@dataclasses.dataclass(frozen=True)
class PreferenceRecord:
    prompt: str | Messages
    chosen: str
    rejected: str


def _lines(path: str | pathlib.Path) -> Iterator[tuple[int, dict[str, Any]]]:
    path = str(path)
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as e:
        raise RecordError(f"cannot read the file ({e.strerror or e})", path=path, line=0) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise RecordError(f"not UTF-8 ({e.reason})", path=path, line=line) from None
    found = False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise RecordError(
                f"bad JSON ({e.msg} at column {e.colno})", path=path, line=number
            ) from None
        if not isinstance(record, dict):
            raise RecordError(
                f"expected a JSON object, got {type(record).__name__}", path=path, line=number
            )
        found = True
        yield number, record
    if not found:
        raise RecordError("the file holds no records", path=path, line=0)


def _string(record: dict[str, Any], key: str, path: str, line: int) -> str:
    if key not in record:
        raise RecordError(
            f"missing field {key!r} (record has {sorted(record)})", path=path, line=line
        )
    value = record[key]
    if not isinstance(value, str):
        raise RecordError(
            f"field {key!r} is {type(value).__name__}, expected a string", path=path, line=line
        )
    return value


def _messages(value: Any, path: str, line: int, *, need_assistant: bool) -> Messages:
    if not isinstance(value, list) or not value:
        raise RecordError("'messages' must be a non-empty list", path=path, line=line)
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise RecordError(f"message {i} is not an object", path=path, line=line)
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise RecordError(
                f"message {i} has role {role!r}; use one of {', '.join(ROLES)}",
                path=path,
                line=line,
            )
        if not isinstance(content, str):
            raise RecordError(f"message {i} has no string 'content'", path=path, line=line)
        out.append({"role": role, "content": content})
    if need_assistant and not any(m["role"] == "assistant" for m in out):
        raise RecordError(
            "the conversation has no assistant message, so there is nothing to learn",
            path=path,
            line=line,
        )
    return out


def _prompt(record: dict[str, Any], path: str, line: int) -> str | Messages:
    if isinstance(record.get("prompt"), list):
        return _messages(record["prompt"], path, line, need_assistant=False)
    return _string(record, "prompt", path, line)


def read_sft_records(path: str | pathlib.Path) -> list[SftRecord]:
    """SFT records of a JSONL file; raises `RecordError` at the first malformed one."""
    out = []
    for line, record in _lines(path):
        if "messages" in record:
            out.append(
                SftRecord(
                    messages=_messages(record["messages"], str(path), line, need_assistant=True)
                )
            )
        elif "prompt" in record or "completion" in record:
            out.append(
                SftRecord(
                    prompt=_string(record, "prompt", str(path), line),
                    completion=_string(record, "completion", str(path), line),
                )
            )
        else:
            raise RecordError(
                "an SFT record needs 'messages', or 'prompt' and 'completion' "
                f"(has {sorted(record)})",
                path=str(path),
                line=line,
            )
    return out


def read_preference_records(path: str | pathlib.Path) -> list[PreferenceRecord]:
    """(prompt, chosen, rejected) records of a JSONL file; `RecordError` on a malformed one."""
    out = []
    for line, record in _lines(path):
        prompt = _prompt(record, str(path), line)
        chosen = _string(record, "chosen", str(path), line)
        rejected = _string(record, "rejected", str(path), line)
        out.append(PreferenceRecord(prompt, chosen, rejected))
    return out


def read_prompts(path: str | pathlib.Path) -> list[str | Messages]:
    """The prompts of a JSONL file (for GRPO/PPO); `RecordError` on a malformed record."""
    return [_prompt(record, str(path), line) for line, record in _lines(path)]
