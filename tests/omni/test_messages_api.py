"""Anthropic Messages requests as chat messages (relax_gym/omni/messages_api.py): system, blocks, tool use and
results, tools and tool_choice map as the module says; the answer is a Messages ``message``; what is not served is
one error naming the field (the route itself: tests/trainer/gateway/test_messages_route.py)."""

from __future__ import annotations

import pytest

from relax_gym.omni.messages_api import MessagesRequestError, chat_body, error_body, message_object, parse_request

PNG = "iVBORw0KGgo="


def test_turns_blocks_and_tools_map_to_chat():
    req = parse_request({
        "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}], "stop_sequences": ["END"],
        "tools": [{"name": "add", "description": "Add.", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "add"}, "metadata": {"user_id": "s9"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is in it?"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": PNG}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Adding."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "2"},
                                         {"type": "text", "text": "Go on."}]}]})
    body = chat_body(req)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is in it?"},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]},
        {"role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "2"},
        {"role": "user", "content": [{"type": "text", "text": "Go on."}]}]
    assert body["tools"] == [{"type": "function", "function": {"name": "add", "description": "Add.",
                                                               "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert (body["max_completion_tokens"], body["stop"], body["user"]) == (64, ["END"], "s9")


def test_a_chat_answer_is_a_message_with_text_and_tool_use():
    req = parse_request({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    chat = {"choices": [{"finish_reason": "tool_calls", "message": {"content": "Let me add.", "tool_calls": [
        {"id": "call_1", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7}}
    message = message_object(req, chat)
    assert message["type"] == "message" and message["role"] == "assistant" and message["stop_reason"] == "tool_use"
    assert message["content"] == [{"type": "text", "text": "Let me add."},
                                  {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 1, "b": 2}}]
    assert message["usage"] == {"input_tokens": 5, "output_tokens": 7}


@pytest.mark.parametrize("body, words", [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role: 'system'"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "messages[0].content[0]: content block of type 'document'"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]: server tools"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5},
     "temperature: Input should be less than or equal to 1"),
])
def test_what_is_not_served_is_named(body, words):
    with pytest.raises(MessagesRequestError) as caught:
        chat_body(parse_request(body))
    assert words in str(caught.value)
    assert error_body(400, str(caught.value))["error"]["type"] == "invalid_request_error"
