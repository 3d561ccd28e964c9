"""``POST /v1/responses`` on the gateway (the translation: omni/responses_api.py), driven by the official openai
client's ``responses.create``: a text answer, a function call and its output sent back (by ``previous_response_id`` and by
the whole input), each recorded into one session whose calls continue token for token, as chat calls are; and
the requests it cannot serve, each one error in OpenAI's shape naming the field."""

from __future__ import annotations

import openai
import pytest

from .test_openai_tools import openai_client, scripted  # noqa: F401 - the fixture

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = 'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_a_text_answer_is_a_response_with_one_message(scripted):
    scripted.engine.replies = ["Hello there."]
    got = scripted.client.responses.create(model="policy", instructions="Be brief.", input="Say hello.",
                                           max_output_tokens=32, user="s1")
    assert got.status == "completed" and got.output_text == "Hello there."
    assert got.output[0].type == "message" and got.output[0].role == "assistant"
    asked = scripted.engine.asked[0]
    assert [m.role for m in asked.messages] == ["system", "user"] and asked.messages[0].text == "Be brief."
    assert got.usage.input_tokens == len(asked.prompt_ids) and got.usage.output_tokens > 0
    record = scripted.api.recorder.get("s1")[0]
    assert record.prompt_ids == asked.prompt_ids and record.text == "Hello there."


@pytest.mark.parametrize("continuation", ["previous_response_id", "whole input"])
def test_a_function_call_and_its_output_continue_the_same_tokens(scripted, continuation):
    scripted.engine.replies = [CALL, "It rains in Paris."]
    first = scripted.client.responses.create(model="policy", input="Weather in Paris?", tools=[WEATHER], user="s2")
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    assert first.output[0].type == "message" and first.output_text == "Let me check."
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"weather": "rain"}'}
    if continuation == "previous_response_id":
        second = scripted.client.responses.create(model="policy", previous_response_id=first.id, input=[result],
                                                  tools=[WEATHER], user="s2")
    else:
        history = [{"role": "user", "content": "Weather in Paris?"}, *[item.model_dump() for item in first.output]]
        second = scripted.client.responses.create(model="policy", input=[*history, result], tools=[WEATHER], user="s2")
    assert second.output_text == "It rains in Paris."
    one, two = scripted.api.recorder.get("s2")
    assert two.continues and two.prompt_ids[: len(one.prompt_ids) + len(one.completion_ids)] == \
        one.prompt_ids + one.completion_ids, "the second call extends the first token for token"
    assert scripted.engine.asked[1].messages[-1].role == "tool"


@pytest.mark.parametrize("body, param, words", [
    ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "tools", "built-in tools ('web_search')"),
    ({"model": "m", "input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id", "no response"),
    ({"model": "m", "input": [{"type": "computer_call"}]}, "input", "items of type 'computer_call'"),
    ({"model": "m", "input": "hi", "frobnicate": 1}, "frobnicate", "unknown field"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input", "input_file"),
])
def test_what_is_not_served_is_one_error_naming_the_field(scripted, body, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        scripted.client.post("/responses", body=body, cast_to=object)
    error = caught.value.body
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"
