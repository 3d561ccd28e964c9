"""The Responses API's requests as chat messages (relax_gym/omni/responses_api.py): roles, items and tools map
as the module says; what is not served is one error naming the field (the route itself:
tests/trainer/gateway/test_responses_route.py)."""

from __future__ import annotations

import pytest

from relax_gym.omni.responses_api import ResponsesRequestError, chat_body, parse_request


def test_roles_and_items_map_to_chat_messages():
    req = parse_request({"model": "m", "instructions": "I", "input": [
        {"role": "developer", "content": "D"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "summary": []}]})
    messages = chat_body(req, [])["messages"]
    assert messages == [{"role": "system", "content": "I"}, {"role": "system", "content": "D"},
                        {"role": "assistant", "content": "A", "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                        {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    with pytest.raises(ResponsesRequestError, match=r"input\[0\].role: 'tool'"):
        chat_body(parse_request({"model": "m", "input": [{"role": "tool", "content": "x"}]}), [])


def test_function_tools_and_choices_take_the_chat_shape():
    body = chat_body(parse_request({"model": "m", "input": "x", "max_output_tokens": 9, "tool_choice": {
        "type": "function", "name": "f"}, "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}), [])
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}} and body["max_completion_tokens"] == 9
    with pytest.raises(ResponsesRequestError, match="tool_choice: an object must be"):
        chat_body(parse_request({"model": "m", "input": "x", "tool_choice": {"type": "web_search"}}), [])
