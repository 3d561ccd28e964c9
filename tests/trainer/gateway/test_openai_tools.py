"""OpenAI function calling on the endpoint: tool schemas rendered into the prompt (Hermes style), ``tool_choice``,
``<tool_call>`` blocks parsed into ``message.tool_calls``, malformed blocks left in the content, tool turns
rendered back, and the errors that name ``tools`` / ``tool_choice``. The model is scripted (an engine of the
API's duck type over the tiny policy's processor), served with ``serve_openai``, and driven by the openai
client over loopback."""

from __future__ import annotations

import contextlib
import json
import threading
from types import SimpleNamespace

import httpx
import openai
import pytest

from relax_gym.omni import from_openai
from relax_gym.omni.openai_tools import (
    FunctionTool,
    ToolMode,
    ToolSpecError,
    conversation_dicts,
    reply_key,
    split_reply,
    tool_mode,
)
from relax_gym.omni.render import extend, render
from relax_gym.omni.tool_calls import (
    find_tool_calls,
    format_tool_call,
    parse_tool_calls,
)
from relax_gym.trainer.engines.http_server import serve_openai
from relax_gym.trainer.gateway.api import OpenAIAPI
from relax_gym.trainer.engines.protocol import FinishReason, GenerateResponse, MetaInfo

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL_TEXT = 'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


class ScriptedEngine:
    """:class:`OpenAIAPI`'s engine duck type over a real processor; each generate answers the next scripted text
    (its canonical token ids and the end-of-turn token), and remembers what it was asked."""

    model_path = None

    def __init__(self, processor, replies=(), max_positions: int | None = 4096) -> None:
        self.processor = processor
        self.replies = list(replies)
        self.max_positions = max_positions
        self.asked: list[SimpleNamespace] = []
        self._lock = threading.Lock()

    def render(self, messages):
        return render(list(messages), self.processor)

    def extend(self, rendered, messages, assistant_token_ids):
        return extend(rendered, list(messages), assistant_token_ids=assistant_token_ids, processor=self.processor)

    def generate_rendered(self, prompt_ids, mm, *, messages, sampling_params, return_logprob, top_logprobs_num, rid,
                          return_text_in_logprobs):
        with self._lock:
            text = self.replies.pop(0) if self.replies else "Done."
            self.asked.append(SimpleNamespace(prompt_ids=list(prompt_ids), mm=mm, messages=list(messages),
                                              sampling=dict(sampling_params)))
        eos = int(self.processor.eos_token_id)
        ids = [int(i) for i in self.processor.encode_text(text)] + [eos]
        meta = MetaInfo(id=rid, finish_reason=FinishReason(type="stop", matched=eos), weight_version="w1",
                        prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                        output_token_logprobs=[(-0.25, i, None) for i in ids])
        return GenerateResponse(text=text, output_ids=ids, meta_info=meta)


def openai_client(url: str, api_key: str = "EMPTY") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0,
                         http_client=httpx.Client(trust_env=False, timeout=60))


@contextlib.contextmanager
def served_api(engine, name: str = "scripted"):
    """``engine``'s API, its ``/v1`` routes served on loopback and an openai client (closed afterwards)."""
    api = OpenAIAPI(engine, model_name=name)
    server = serve_openai(api)
    client = openai_client(server.url)
    try:
        yield SimpleNamespace(engine=engine, api=api, server=server, client=client, processor=engine.processor)
    finally:
        client.close()
        server.close()


@pytest.fixture
def scripted(policy):
    """A fresh scripted engine, its API, the served ``/v1`` routes and an openai client."""
    with served_api(ScriptedEngine(policy[1])) as s:
        yield s


def decoded_prompt(s) -> str:
    return s.processor.decode(s.engine.asked[-1].prompt_ids, skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------- units


def test_split_reply_parses_blocks_and_keeps_malformed_ones():
    content, calls = split_reply(CALL_TEXT + '\n<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>')
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"} and calls[1]["function"]["arguments"] == "{}"
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    bad = "Hm. <tool_call>{not json}</tool_call> and <tool_call>{\"name\": \"get_time\"}</tool_call> then <tool_call>{\"na"
    content, calls = split_reply(bad)
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    assert content == "Hm. <tool_call>{not json}</tool_call> and  then <tool_call>{\"na"  # malformed + unclosed stay
    assert split_reply("  plain text  ") == ("  plain text  ", [])  # no block: the text, untouched
    assert split_reply('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')[0] is None


def test_tool_call_text_format_round_trips():
    text = format_tool_call("get_weather", '{"city": "Paris"}')
    assert text == '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    (call,) = parse_tool_calls(text)
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})
    spans = find_tool_calls("a" + text + "b")
    assert [(s.start, s.end) for s in spans] == [(1, 1 + len(text))]


def test_tool_mode_and_its_errors():
    tools = [FunctionTool.model_validate(WEATHER), FunctionTool.model_validate(CLOCK)]
    assert tool_mode(tools, None) == tool_mode(tools, "auto") == ToolMode(listed=True)
    assert tool_mode(tools, "none") == ToolMode() and tool_mode(None, None) == ToolMode()
    assert tool_mode(tools, "required") == ToolMode(listed=True, required=True)
    named = {"type": "function", "function": {"name": "get_time"}}
    assert tool_mode(tools, named) == ToolMode(listed=True, required=True, name="get_time")
    for choice, match in [("always", "not 'auto'"), ({"type": "function", "function": {"name": "nope"}}, "not in tools"),
                          ({"type": "function"}, "named choice")]:
        with pytest.raises(ToolSpecError, match=match):
            tool_mode(tools, choice)
    with pytest.raises(ToolSpecError, match="^tools: .*get_time"):
        tool_mode([*tools, FunctionTool.model_validate(CLOCK)], None)


def test_conversation_dicts_render_tools_as_text():
    tools = [FunctionTool.model_validate(WEATHER)]
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C"}]},
    ]
    dicts = conversation_dicts(messages, tools, tool_mode(tools, "required"))
    assert dicts[0]["role"] == "system" and dicts[0]["content"].startswith("Be brief.\n\nYou may call tools.")
    assert json.dumps(tools[0].schema()) in dicts[0]["content"] and "must call at least one tool" in dicts[0]["content"]
    assert dicts[2]["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert dicts[3] == {"role": "tool", "content": "<tool_response>\nsunny\n</tool_response>", "tool_call_id": "call_1",
                        "name": "get_weather"}
    assert [p["text"] for p in dicts[4]["content"]] == ["<tool_response>\n", "21 C", "\n</tool_response>"]
    assert from_openai(dicts)[3].name == "get_weather"
    without = conversation_dicts(messages[1:2], tools, tool_mode(tools, None))
    assert without[0]["role"] == "system" and without[1] == messages[1]  # a system message of their own
    assert conversation_dicts(messages[1:2], tools, tool_mode(tools, "none")) == [messages[1]]
    assert reply_key(None, []) == reply_key("", None) == reply_key([{"type": "text", "text": " "}], [])
    a = [{"function": {"name": "f", "arguments": '{"a": 1, "b": [2]}'}}]
    assert reply_key("x", a) == reply_key("x", [{"function": {"name": "f", "arguments": '{"b":[2],"a":1}'}}])


# ---------------------------------------------------------------------------------------------- over HTTP


def test_tool_calls_come_back_openai_shaped(scripted):
    scripted.engine.replies = [CALL_TEXT]
    r = scripted.client.chat.completions.create(
        model="m", messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Paris?"}],
        tools=[WEATHER, CLOCK], max_tokens=50)
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    prompt = decoded_prompt(scripted)
    assert prompt.startswith("<|im_start|>system\nYou are terse.\n\nYou may call tools.")
    assert json.dumps(FunctionTool.model_validate(WEATHER).schema()) in prompt and '"get_time"' in prompt
    (record,) = scripted.api.recorder.get("default")
    assert record.text == CALL_TEXT and record.finish_reason == "tool_calls"


def test_tool_choice_none_required_and_named(scripted):
    def ask(**kw):
        scripted.engine.replies = [CALL_TEXT]
        return scripted.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Paris?"}],
                                                       tools=[WEATHER, CLOCK], **kw)

    r = ask(tool_choice="none")
    assert r.choices[0].message.content == CALL_TEXT and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop" and "<tools>" not in decoded_prompt(scripted)
    assert ask(tool_choice="required").choices[0].message.tool_calls
    assert "In this reply you must call at least one tool." in decoded_prompt(scripted)
    ask(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert 'In this reply you must call the tool "get_time".' in decoded_prompt(scripted)


def test_malformed_block_stays_in_content(scripted):
    scripted.engine.replies = ['I will call <tool_call>{"name": get_weather}</tool_call>']
    r = scripted.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=[WEATHER])
    assert r.choices[0].message.content == 'I will call <tool_call>{"name": get_weather}</tool_call>'
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("extra, param, words", [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", "pattern"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "function"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "not in tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}]}, "messages", "tool_calls[0]"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "tool_call_id"),
])
def test_bad_tool_requests_name_the_param(scripted, extra, param, words):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(openai.BadRequestError) as info:
        scripted.client.chat.completions.create(**body)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == param and err["message"].startswith(param)
    assert words in err["message"] and err["type"] == "invalid_request_error"
    assert not scripted.engine.asked  # refused before generating


def test_replayed_tool_turns_render_as_the_model_wrote_them(scripted):
    """A conversation sent back with the returned assistant message (and tool results) renders the same text the
    model wrote, even after the session's continuation state is gone (a fresh render)."""
    odd = 'Checking…\n\n<tool_call>\n{"arguments": {"city":"Paris"}, "name": "get_weather"}\n</tool_call>'
    scripted.engine.replies = [odd]
    messages = [{"role": "user", "content": "Paris?"}]
    r = scripted.client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], user="replay")
    assistant = r.choices[0].message.model_dump(exclude_none=True)
    scripted.api.recorder.drop("replay")  # no continuation: rendered afresh
    follow = [*messages, assistant, {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "sunny"}]
    scripted.client.chat.completions.create(model="m", messages=follow, tools=[WEATHER], user="replay")
    assert scripted.api.recorder.get("replay")[0].continues is False
    assert "<|im_start|>assistant\n" + odd + "<|im_end|>\n<|im_start|>tool\n<tool_response>\nsunny\n</tool_response>" \
        in decoded_prompt(scripted)
    edited = [*messages, {**assistant, "content": "Something else."}, follow[-1]]
    scripted.client.chat.completions.create(model="m", messages=edited, tools=[WEATHER], user="replay")
    canonical = 'Something else.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert "<|im_start|>assistant\n" + canonical + "<|im_end|>" in decoded_prompt(scripted)
