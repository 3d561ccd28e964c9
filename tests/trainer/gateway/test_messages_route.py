"""``POST /v1/messages`` (Anthropic's Messages API) on the gateway (the translation: omni/messages_api.py): the
official ``anthropic`` client (in a venv of its own, made by the code: its pins are not ours) runs a tool use and
its result, recorded into the key's session like chat calls and continuing the same tokens; requests as the client
sends them (its key in ``x-api-key``) get errors in Anthropic's shape."""

from __future__ import annotations

import json
import subprocess

import httpx

from relax_gym.trainer.gateway.api import with_api_key_as_bearer

from tests.envs.agent_clients import sdk_venv

from .test_openai_tools import scripted  # noqa: F401 - the fixture

CALL = 'Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
ADD = {"name": "add", "description": "Add two numbers.",
       "input_schema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}


CLIENT = r'''
import json, sys
import anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
tools = [json.loads(sys.argv[3])]
ask = [{"role": "user", "content": "1 + 2?"}]
first = client.messages.create(model="m", max_tokens=64, system="Use the tool.", tools=tools, messages=ask)
use = next(b for b in first.content if b.type == "tool_use")
result = [{"type": "tool_result", "tool_use_id": use.id, "content": str(use.input["a"] + use.input["b"])}]
second = client.messages.create(model="m", max_tokens=64, system="Use the tool.", tools=tools,
                                messages=[*ask, {"role": "assistant", "content": first.content},
                                          {"role": "user", "content": result}])
try:
    client.messages.create(model="m", max_tokens=4, messages=[{"role": "system", "content": "x"}])
    refused = None
except anthropic.BadRequestError as exc:
    refused = exc.body
print(json.dumps({"first": first.model_dump(), "second": second.model_dump(), "refused": refused}))
'''


def test_anthropics_own_client_runs_a_tool_use_and_its_result(scripted):
    python = sdk_venv() / "bin" / "python"  # Anthropic's client, from the venv of tests/envs/agent_clients.py
    key = scripted.api.keys.issue("ep-0")
    scripted.engine.replies = [CALL, "It is 3."]
    run = subprocess.run([str(python), "-c", CLIENT, scripted.server.url, key, json.dumps(ADD)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    first, second = got["first"], got["second"]
    assert first["stop_reason"] == "tool_use" and first["content"][1]["input"] == {"a": 1, "b": 2}
    assert [(b["type"], b["text"]) for b in second["content"]] == [("text", "It is 3.")]
    assert got["refused"]["error"]["type"] == "invalid_request_error" and "messages[0].role" in \
        got["refused"]["error"]["message"]
    one, two = scripted.api.recorder.get("ep-0")
    assert two.continues and two.prompt_ids[: len(one.prompt_ids) + len(one.completion_ids)] == \
        one.prompt_ids + one.completion_ids
    tool = scripted.engine.asked[1].messages[-1]
    assert tool.role == "tool" and tool.text.split() == ["<tool_response>", "3", "</tool_response>"]


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


def test_an_x_api_key_is_the_bearer_unless_one_is_sent():
    assert with_api_key_as_bearer({"X-Api-Key": "k1"})["Authorization"] == "Bearer k1"
    kept = {"Authorization": "Bearer k2", "x-api-key": "k1"}
    assert with_api_key_as_bearer(kept) is kept and with_api_key_as_bearer({}) == {}
