"""Tool calls in a chat answer, in the Hermes format that Qwen2.5, Hermes and many others use.

Their chat templates list the tools in the prompt and ask the model to answer a call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; vLLM's `hermes` tool parser reads
the same blocks. `ToolCallParser` takes the answer's text as it streams: text outside the
blocks is content, sent on at once except for a tail that may be the start of a block; each
block becomes an OpenAI `tool_calls` entry when it closes (or when the answer ends). A block
that is not a JSON object with a string `name` stays content, as the model wrote it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _held_back(text: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of OPEN."""
    for n in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def _tool_call(block: str) -> dict[str, Any] | None:
    try:
        call = json.loads(block)
    except ValueError:
        return None
    if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


class ToolCallParser:
    """Splits a streamed answer into content and tool calls (see the module docstring)."""

    def __init__(self):
        self._pending = ""  # text not yet handed out
        self._in_call = False

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """The content that can be sent now, and the calls that closed in `text`."""
        self._pending += text
        content, calls = [], []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE)
                if end < 0:
                    break
                block, self._pending = self._pending[:end], self._pending[end + len(CLOSE) :]
                self._in_call = False
                call = _tool_call(block)
                if call is None:
                    content.append(OPEN + block + CLOSE)
                else:
                    calls.append(call)
                continue
            start = self._pending.find(OPEN)
            if start < 0:
                keep = _held_back(self._pending)
                cut = len(self._pending) - keep
                content.append(self._pending[:cut])
                self._pending = self._pending[cut:]
                break
            content.append(self._pending[:start])
            self._pending = self._pending[start + len(OPEN) :]
            self._in_call = True
        return "".join(content), calls

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is left when the answer ends: an unclosed block is a call if it parses."""
        rest, self._pending = self._pending, ""
        if not self._in_call:
            return rest, []
        self._in_call = False
        call = _tool_call(rest)
        return (OPEN + rest, []) if call is None else ("", [call])
