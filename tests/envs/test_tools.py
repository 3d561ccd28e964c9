"""@tool schemas, <tool_call> parsing and ToolBox error handling: nothing the model writes raises."""

from __future__ import annotations

from typing import Literal

import pytest

from relax_gym.envs.tools import BadToolCall, ToolBox, ToolCall, ToolError, ToolOutput, parse_tool_calls, tool, tool_message
from relax_gym.omni import ImagePart
import numpy as np


@tool
def search(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast", tags: list[str] | None = None) -> str:
    """Search the notes.

    Longer explanation that is not the summary.

    Args:
        query: words to look for,
            possibly several.
        limit: how many hits to return.

    Returns:
        the hits, one per line.
    """
    if query == "explode":
        raise RuntimeError("index corrupted")
    if query == "refuse":
        raise ToolError("queries may not be 'refuse'.")
    return f"{query}|{limit}|{mode}|{tags}"


def test_schema_from_signature_and_docstring():
    s = search.schema()
    assert s["type"] == "function" and s["function"]["name"] == "search"
    assert s["function"]["description"] == "Search the notes. Longer explanation that is not the summary."
    params = s["function"]["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {"type": "string", "description": "words to look for, possibly several."}
    assert params["properties"]["limit"]["type"] == "integer" and params["properties"]["limit"]["default"] == 5
    assert params["properties"]["mode"]["enum"] == ["fast", "exact"]
    assert "description" not in params["properties"]["mode"]


def test_ctx_is_hidden_and_unannotated_params_are_refused():
    @tool(name="peek")
    def peek_fn(ctx, n: int) -> str:
        """Peek."""
        return f"{ctx}:{n}"

    assert peek_fn.name == "peek" and list(peek_fn.parameters["properties"]) == ["n"]
    assert ToolBox([peek_fn]).run(ToolCall("peek", {"n": 2}), ctx="C").text == "C:2"
    with pytest.raises(TypeError, match="needs a type annotation"):
        @tool
        def bad(x):
            return x


@pytest.mark.parametrize(
    "text, expected",
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>', [ToolCall("search", {"query": "a"})]),
        ('<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"b\\"}"}\n</tool_call>', [ToolCall("search", {"query": "b"})]),
        ('<tool_call>{"name": "search"}</tool_call>', [ToolCall("search", {})]),
        ("no calls here", []),
    ],
)
def test_parse_valid(text, expected):
    assert parse_tool_calls(text) == expected


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>{name: search}</tool_call>", "not valid JSON"),
        ('<tool_call>["search"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "s", "arguments": "{oops"}</tool_call>', "string that is not valid JSON"),
        ('<tool_call>{"name": "s", "arguments": [1]}</tool_call>', "'arguments' must be a JSON object"),
        ('<tool_call>{"name": "s"}', "not closed"),
    ],
)
def test_parse_malformed_becomes_bad_call(text, error):
    (call,) = parse_tool_calls(text)
    assert isinstance(call, BadToolCall) and error in call.error


def test_multiple_calls_in_order():
    text = '<tool_call>{"name": "a"}</tool_call> and <tool_call>{"name": "b"}</tool_call>'
    assert [c.name for c in parse_tool_calls(text)] == ["a", "b"]


@pytest.mark.parametrize(
    "call, text",
    [
        (ToolCall("search", {"query": "x", "limit": "3"}), "x|3|fast|None"),  # lax int parsing like JSON schema users expect
        (ToolCall("search", {"query": "x", "tags": ["a"]}), "x|5|fast|['a']"),
        (ToolCall("search", {"limit": 1}), "Error: bad arguments for search: query: Field required."),
        (ToolCall("search", {"query": "x", "mode": "slow"}), "Error: bad arguments for search: mode: Input should be 'fast' or 'exact'."),
        (ToolCall("search", {"query": "x", "colour": 1}), "Error: bad arguments for search: colour: Extra inputs are not permitted."),
        (ToolCall("grep", {}), "Error: unknown tool 'grep'; available: search."),
        (ToolCall("search", {"query": "explode"}), "Error: tool search failed: RuntimeError: index corrupted"),
        (ToolCall("search", {"query": "refuse"}), "Error: queries may not be 'refuse'."),
        (BadToolCall("{", "the tool call is not valid JSON"), "Error: the tool call is not valid JSON."),
    ],
)
def test_toolbox_reports_errors_as_text(call, text):
    out = ToolBox([search]).run(call)
    assert out.text == text
    assert out.is_error == text.startswith("Error")


def test_tool_message_wraps_text_and_media():
    part = ImagePart.of(np.zeros((4, 4, 3), np.uint8))
    msg = tool_message(ToolOutput(text="here", parts=[part]), ToolCall("zoom", {}))
    assert msg.role == "tool" and msg.name == "zoom"
    assert msg.content[0].text == "<tool_response>\nhere" and msg.content[1] is part and msg.content[2].text == "\n</tool_response>"
