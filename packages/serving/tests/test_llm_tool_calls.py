"""Hermes-format tool calls read from a chat answer, whole or as it streams."""

from __future__ import annotations

import json

import pytest

from jaxstack.serving._src.llm.tool_calls import ToolCallParser

ANSWER = (
    "Let me check. <tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
    "</tool_call>\n<tool_call>"
    '{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call> Done <tool'
)


def parse_in_pieces(text: str, size: int) -> tuple[str, list[dict]]:
    parser, content, calls = ToolCallParser(), [], []
    for start in range(0, len(text), size):
        piece, closed = parser.feed(text[start : start + size])
        content.append(piece)
        calls += closed
    rest, more = parser.finish()
    return "".join(content) + rest, calls + more


@pytest.mark.parametrize("size", [1, 2, 5, 11, len(ANSWER)])
def test_calls_and_content_are_the_same_however_the_answer_streams(size):
    content, calls = parse_in_pieces(ANSWER, size)
    assert content == "Let me check. \n Done <tool"
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "C"}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2


def test_content_that_may_open_a_call_is_held_back_until_it_cannot():
    parser = ToolCallParser()
    assert parser.feed("a <tool") == ("a ", [])
    assert parser.feed("box> b") == ("<toolbox> b", [])


def test_a_block_that_is_no_call_stays_content_and_an_unclosed_one_is_read_at_the_end():
    assert parse_in_pieces("<tool_call>not json</tool_call>!", 3) == (
        "<tool_call>not json</tool_call>!",
        [],
    )
    assert parse_in_pieces('<tool_call>{"arguments": {}}</tool_call>', 4)[1] == []
    content, calls = parse_in_pieces('<tool_call>{"name": "f", "arguments": "{}"}', 4)
    assert content == "" and calls[0]["function"] == {"name": "f", "arguments": "{}"}
    assert parse_in_pieces("<tool_call>{cut", 4) == ("<tool_call>{cut", [])
