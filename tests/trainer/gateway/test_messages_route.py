"""``POST /v1/messages`` (Anthropic's Messages API) on the gateway (the translation: omni/messages_api.py): a
request as Anthropic's client sends it (its key in ``x-api-key``, an ``anthropic-version`` header) gets a Messages
answer, tool use included, recorded into the key's session like a chat call; errors come in Anthropic's shape."""

from __future__ import annotations

import httpx

from .test_openai_tools import scripted  # noqa: F401 - the fixture

CALL = 'Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
ADD = {"name": "add", "description": "Add two numbers.",
       "input_schema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}


def _post(scripted, body, key):
    return httpx.post(f"{scripted.server.url}/v1/messages", json=body, timeout=60,
                      headers={"x-api-key": key, "anthropic-version": "2023-06-01"})


def test_a_tool_use_then_its_result_continue_one_session(scripted):
    session, key = "ep-1", scripted.api.keys.issue("ep-1")
    scripted.engine.replies = [CALL, "It is 3."]
    first = _post(scripted, {"model": "m", "max_tokens": 64, "system": "Use the tool.", "tools": [ADD],
                             "messages": [{"role": "user", "content": "1 + 2?"}]}, key)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["stop_reason"] == "tool_use" and answer["content"][0] == {"type": "text", "text": "Let me add."}
    use = answer["content"][1]
    assert (use["type"], use["name"], use["input"]) == ("tool_use", "add", {"a": 1, "b": 2})
    second = _post(scripted, {"model": "m", "max_tokens": 64, "system": "Use the tool.", "tools": [ADD], "messages": [
        {"role": "user", "content": "1 + 2?"}, {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "3"}]}]}, key)
    assert second.json()["content"] == [{"type": "text", "text": "It is 3."}]
    assert second.json()["stop_reason"] == "end_turn"
    one, two = scripted.api.recorder.get(session)
    assert two.continues and two.prompt_ids[: len(one.prompt_ids) + len(one.completion_ids)] == \
        one.prompt_ids + one.completion_ids, "the second call extends the first token for token"


def test_errors_come_in_anthropics_shape(scripted):
    key = scripted.api.keys.issue("ep-2")
    bad = _post(scripted, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, key)
    assert bad.status_code == 400
    assert bad.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                      "message": "max_tokens: Field required"}}
    stranger = _post(scripted, {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, "nope")
    assert stranger.status_code == 401 and stranger.json()["error"]["type"] == "authentication_error"
