"""Reading SFT, preference and prompt records from JSON Lines files, in TRL's dataset formats.

Every record is checked when the file is read, before any model is built, so a bad one is
reported as `path:line: what is wrong` (a `RecordError`) instead of failing mid-run. A record is
*standard* (strings) or *conversational* (lists of `{"role", "content"}` messages, rendered with
the chat template); the types TRL names are accepted:

- SFT: language modeling `{"text"}` or `{"messages"}`; prompt-completion `{"prompt",
  "completion"}` (two strings, or two message lists, the completion the assistant's).
- Preferences (DPO, ORPO): `{"prompt", "chosen", "rejected"}` (explicit prompt), or `{"chosen",
  "rejected"}` whose shared beginning is the prompt (implicit prompt, as TRL's
  `extract_prompt` splits it). A conversational prompt may have string completions: each is
  then the assistant's reply.
- Prompts (GRPO, PPO): prompt-only `{"prompt"}` (a string or messages); other keys are ignored.

Anything else is an error naming the fields the format expects.
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
    """One SFT example: a conversation (`messages`), a text (`text`), or a prompt with its
    completion (both strings, or both message lists)."""

    messages: Messages | None = None
    prompt: str | Messages | None = None
    completion: str | Messages | None = None
    text: str | None = None


@dataclasses.dataclass(frozen=True)
class PreferenceRecord:
    """A prompt and two completions; conversational when `prompt` is a message list, and then
    `chosen` and `rejected` are lists of assistant messages."""

    prompt: str | Messages
    chosen: str | Messages
    rejected: str | Messages


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
    if "prompt" not in record:
        raise RecordError(
            f"a prompt record needs 'prompt', a string or a list of messages (has "
            f"{sorted(record)})",
            path=path,
            line=line,
        )
    if isinstance(record["prompt"], list):
        return _messages(record["prompt"], path, line, need_assistant=False)
    return _string(record, "prompt", path, line)


def _completion(value: Any, key: str, conversational: bool, path: str, line: int):
    """A completion after a prompt: a string, or (after a conversational prompt) assistant
    messages; a string after a conversational prompt becomes the assistant's message."""
    if conversational and isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    if conversational and isinstance(value, list):
        messages = _messages(value, path, line, need_assistant=False)
        if any(m["role"] != "assistant" for m in messages):
            raise RecordError(
                f"{key!r} may hold only assistant messages (the prompt holds the rest)",
                path=path,
                line=line,
            )
        return messages
    if isinstance(value, str):
        return value
    raise RecordError(
        f"field {key!r} is {type(value).__name__}, expected a string (after a string prompt; a "
        "conversational prompt, a list of messages, takes message lists)",
        path=path,
        line=line,
    )


def read_sft_records(path: str | pathlib.Path) -> list[SftRecord]:
    """SFT records of a JSONL file; raises `RecordError` at the first malformed one."""
    out = []
    for line, record in _lines(path):
        where = {"path": str(path), "line": line}
        if "messages" in record:
            messages = _messages(record["messages"], str(path), line, need_assistant=True)
            out.append(SftRecord(messages=messages))
        elif "prompt" in record and "completion" in record:
            prompt = _prompt(record, str(path), line)
            conversational = isinstance(prompt, list)
            if conversational != isinstance(record["completion"], list):
                raise RecordError(
                    "'prompt' and 'completion' must both be strings (standard) or both lists "
                    "of messages (conversational)",
                    **where,
                )
            completion = _completion(
                record["completion"], "completion", conversational, str(path), line
            )
            out.append(SftRecord(prompt=prompt, completion=completion))
        elif "text" in record:
            out.append(SftRecord(text=_string(record, "text", str(path), line)))
        else:
            raise RecordError(
                "an SFT record needs 'messages' or 'text' (language modeling), or 'prompt' and "
                f"'completion' (prompt-completion); it has {sorted(record)}",
                **where,
            )
    return out


def read_preference_records(path: str | pathlib.Path) -> list[PreferenceRecord]:
    """(prompt, chosen, rejected) records of a JSONL file; `RecordError` on a malformed one."""
    out = []
    for line, record in _lines(path):
        if "chosen" not in record or "rejected" not in record:
            raise RecordError(
                "a preference record needs 'chosen' and 'rejected', with 'prompt' (explicit "
                f"prompt) or without it (the prompt is their shared beginning); it has "
                f"{sorted(record)}",
                path=str(path),
                line=line,
            )
        if "prompt" not in record:
            record = _implicit_prompt(record, str(path), line)
        prompt = _prompt(record, str(path), line)
        conversational = isinstance(prompt, list)
        chosen = _completion(record["chosen"], "chosen", conversational, str(path), line)
        rejected = _completion(record["rejected"], "rejected", conversational, str(path), line)
        out.append(PreferenceRecord(prompt, chosen, rejected))
    return out


def _implicit_prompt(record: dict[str, Any], path: str, line: int) -> dict[str, Any]:
    """TRL's `extract_prompt`: the longest shared beginning of chosen and rejected (characters
    of strings, messages of conversations) is the prompt, less a space it ends on."""
    chosen, rejected = record["chosen"], record["rejected"]
    if isinstance(chosen, list) and isinstance(rejected, list):
        chosen = _messages(chosen, path, line, need_assistant=True)
        rejected = _messages(rejected, path, line, need_assistant=True)
    elif not (isinstance(chosen, str) and isinstance(rejected, str)):
        raise RecordError(
            "'chosen' and 'rejected' must both be strings or both lists of messages",
            path=path,
            line=line,
        )
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if isinstance(chosen, str) and n and chosen[n - 1] == " ":
        n -= 1
    if n == 0 or n == min(len(chosen), len(rejected)):
        raise RecordError(
            "without 'prompt', 'chosen' and 'rejected' must share a beginning (the prompt) and "
            "then differ; add a 'prompt' field",
            path=path,
            line=line,
        )
    return {"prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


def read_prompts(path: str | pathlib.Path) -> list[str | Messages]:
    """The prompts of a JSONL file (for GRPO/PPO); `RecordError` on a malformed record."""
    return [_prompt(record, str(path), line) for line, record in _lines(path)]
