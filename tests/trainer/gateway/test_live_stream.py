"""``stream: true`` as the engine generates, on all three APIs: the first text leaves the server while the engine is
still generating (ordered by an event the client sets, no clock), the pieces join to the non-streamed answer, tool
calls arrive whole once the completion is known, and the recorded ids are those of a non-streamed call.

The engine here is the scripted one of test_openai_tools (a real processor, scripted replies) with ``on_token``:
it hands its tokens out one by one and, after ``hold_after`` of them, waits for ``release`` — which only the
client sets, on its first piece of text. A server that sent its events only at the end would never let the client
see that piece, and the engine's wait would end the call with an error. The real engine's tokens are checked
against its answers in tests/trainer/engines/test_engine_stream.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading

import httpx
import openai
import pytest

from relax_gym.omni.messages_api import parse_request as parse_messages
from relax_gym.trainer.engines.token_stream import TextDeltas, TokenFeed
from relax_gym.trainer.gateway.live_stream import LiveCompletion

from .test_openai_tools import CALL_TEXT, WEATHER, ScriptedEngine, served_api

REPLY = "Once upon a time a small robot learned to stream its words one by one."
HOLD_AFTER = 4
WAIT_S = 60  # the engine waits this long for the client at most (a wait that ends unreleased fails the call)


class StreamingScriptedEngine(ScriptedEngine):
    """The scripted engine, streaming: ``on_token`` gets each id; after ``hold_after`` ids it waits for
    ``release`` (60 s at most, then the call fails: the client never saw a piece)."""

    def __init__(self, processor, replies=(), hold_after: int = HOLD_AFTER) -> None:
        super().__init__(processor, replies)
        self.hold_after = hold_after
        self.release = threading.Event()
        self.streamed: list[list[int]] = []

    def decode(self, ids, **kwargs):
        return self.processor.decode(list(ids), **kwargs)

    def generate_rendered(self, prompt_ids, mm, *, messages, sampling_params, return_logprob, top_logprobs_num, rid,
                          return_text_in_logprobs, on_token=None):
        out = super().generate_rendered(prompt_ids, mm, messages=messages, sampling_params=sampling_params,
                                        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num, rid=rid,
                                        return_text_in_logprobs=return_text_in_logprobs)
        sent = []
        for i, token in enumerate(out.output_ids):
            if on_token is not None:
                on_token(token)
                sent.append(token)
            if i + 1 == self.hold_after and on_token is not None and not self.release.wait(WAIT_S):
                raise RuntimeError("the client saw no text while the engine was generating")
        self.streamed.append(sent)
        return out


@pytest.fixture
def live(policy):
    with served_api(StreamingScriptedEngine(policy[1]), "live") as s:
        yield s.engine, s.api, s.server, s.client


def test_chat_text_leaves_before_the_engine_ends_and_joins_to_the_plain_answer(live):
    engine, api, _, client = live
    engine.replies = [REPLY, REPLY]
    engine.release.set()
    plain = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Story?"}], user="plain")
    engine.release.clear()
    pieces = []
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Story?"}],
                                            user="streamed", stream=True, stream_options={"include_usage": True})
    for event in stream:
        if event.choices and event.choices[0].delta.content:
            pieces.append(event.choices[0].delta.content)
            engine.release.set()  # only now may the engine go past its HOLD_AFTER-th token
    assert len(pieces) > 1 and "".join(pieces) == plain.choices[0].message.content == REPLY
    assert engine.streamed[-1] and len(engine.streamed[-1]) > HOLD_AFTER
    (a,), (b,) = api.recorder.get("plain"), api.recorder.get("streamed")
    assert (a.prompt_ids, a.completion_ids, a.logprobs) == (b.prompt_ids, b.completion_ids, b.logprobs)
    assert event.usage.completion_tokens == len(b.completion_ids)


def test_a_stop_given_as_one_string_holds_back_only_that_string(live):
    """OpenAI's ``stop`` may be one string: it is one stop string ("robots!": only the tail "robot" waits a token),
    not its characters (each of which would end the live text at the first "o")."""
    engine, _, _, client = live
    engine.replies = [REPLY]
    pieces = []
    for event in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Story?"}],
                                                stop="robots!", stream=True):
        if event.choices and event.choices[0].delta.content:
            pieces.append(event.choices[0].delta.content)
            engine.release.set()
    assert "".join(pieces) == REPLY
    assert "".join(pieces[:-1]).startswith("Once upon a time a small robot learned"), pieces  # given out live


def test_chat_tool_calls_come_whole_and_the_markup_never_reaches_the_content(live):
    engine, _, _, client = live
    engine.replies = [CALL_TEXT]
    engine.release.set()
    with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "Paris?"}],
                                        tools=[WEATHER]) as stream:
        contents = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(contents) == "Let me check." and "<" not in "".join(contents)
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_responses_events_stream_text_then_complete_and_continue_by_previous_response_id(live):
    engine, api, _, client = live
    engine.replies = [REPLY, "Again."]
    types, pieces = [], []
    with client.responses.stream(model="m", input="Story?", instructions="Be brief.") as stream:
        for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                pieces.append(event.delta)
                engine.release.set()
        final = stream.get_final_response()
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert types.index("response.output_item.added") < types.index("response.output_text.delta")
    assert "".join(pieces) == final.output_text == REPLY and len(pieces) > 1
    again = client.responses.create(model="m", input="More?", previous_response_id=final.id)
    assert again.output_text == "Again."  # the streamed response was kept for its session
    assert "Story?" in engine.processor.decode(engine.asked[-1].prompt_ids)


def test_responses_function_call_items_carry_their_arguments(live):
    engine, _, _, client = live
    engine.replies = [CALL_TEXT]
    engine.release.set()
    tool = {"type": "function", "name": "get_weather", "description": "Weather of a city",
            "parameters": WEATHER["function"]["parameters"]}
    with client.responses.stream(model="m", input="Paris?", tools=[tool]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"] and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert "response.function_call_arguments.done" in kinds and final.output_text == "Let me check."


def test_messages_events_in_anthropics_order_on_the_wire(live):
    engine, _, server, _ = live
    engine.replies = [REPLY]
    body = {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Story?"}]}
    parse_messages(body)  # the body is one the Messages API takes
    kinds, text = [], []
    with httpx.Client(base_url=server.url, trust_env=False, timeout=60) as http:
        with http.stream("POST", "/v1/messages", json=body, headers={"x-api-key": "EMPTY"}) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            for line in r.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    kinds.append(event["type"])
                    if event["type"] == "content_block_delta":
                        text.append(event["delta"]["text"])
                        engine.release.set()
                    if event["type"] == "message_delta":
                        stop, usage = event["delta"]["stop_reason"], event["usage"]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "".join(text) == REPLY and len(text) > 1 and stop == "end_turn" and usage["output_tokens"] > HOLD_AFTER


def test_a_failure_after_the_first_event_is_the_apis_error_event(live):
    engine, api, _, client = live
    engine.replies = [REPLY]  # release is never set: the engine gives up after its wait and the call fails
    engine.hold_after = 1
    engine.release.wait = lambda timeout=None: False  # noqa: E731 - fail at once instead of waiting 60 s
    with pytest.raises(openai.APIError, match="saw no text"):
        for _ in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], user="f",
                                                stream=True):
            pass
    calls, failures = api.recorder.close("f")
    assert calls == [] and len(failures) == 1 and "saw no text" in failures[0]  # noted as the plain call's would be


LOOKUP_CALL = '<tool_call>{"name": "lookup", "arguments": {"name": "amber"}}</tool_call>'


@pytest.mark.parametrize("client", ["openai-responses", "anthropic", "agents-sdk", "langchain"])
def test_the_sdks_streaming_helpers_put_our_events_together(live, tmp_path, client):
    """Each SDK's own streaming (the openai client's ``responses.stream``, Anthropic's ``messages.stream``, the
    Agents SDK's ``Runner.run_streamed``, LangChain's ``ChatOpenAI.stream``) from the agent-SDK venv, a tool call then the answer: the programs of
    tests/envs/agent_clients.py run as their users run them, every call of theirs streamed from the engine."""
    from tests.envs.agent_clients import NOTEBOOK, PROGRAMS, sdk_venv

    engine, _, server, _ = live
    engine.replies = [LOOKUP_CALL, NOTEBOOK["amber"]]
    engine.release.set()
    (tmp_path / "task.txt").write_text("What number is next to amber in the notebook?")
    (tmp_path / "agent.py").write_text(PROGRAMS[client])
    env = {"PATH": os.environ.get("PATH", ""), "OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "EMPTY",
           "OPENAI_MODEL": "policy", "OPENAI_AGENTS_DISABLE_TRACING": "1", "NO_PROXY": "*"}
    run = subprocess.run([str(sdk_venv() / "bin" / "python"), "agent.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "answer.txt").read_text().strip() == NOTEBOOK["amber"]
    streamed = [bool(ids) for ids in engine.streamed]
    assert len(streamed) == 2 and (all(streamed) if client != "openai-responses" else streamed == [True, False])


def test_a_live_completion_gives_final_pieces_then_what_the_recorded_content_adds(policy):
    processor = policy[1]
    ids = [int(i) for i in processor.encode_text(REPLY)]
    feed = TokenFeed()
    for token in ids:
        feed.put(token)
    completion = {"choices": [{"message": {"content": REPLY + " The end."}}]}  # the record's content goes further
    feed.end(completion)
    deltas = TextDeltas(lambda t: processor.decode(list(t), skip_special_tokens=True))
    live = LiveCompletion(feed, deltas, request_id="chatcmpl-1", created=0, model="m", prompt_tokens=3)
    pieces = list(live.pieces())
    assert "".join(pieces) == REPLY + " The end." and pieces[-1] == " The end." and live.completion() is completion


AGENT_WITH_A_PICTURE = '''
import asyncio, base64, io, os
from agents import Agent, Runner, ToolOutputImage, function_tool

PNG = base64.b64decode(open("frame.b64").read())

@function_tool
def look() -> ToolOutputImage:
    "Look at the picture."
    return ToolOutputImage(image_url="data:image/png;base64," + base64.b64encode(PNG).decode())

agent = Agent(name="viewer", instructions="Look, then say what you saw.", tools=[look], model=os.environ["OPENAI_MODEL"])

async def main():
    result = Runner.run_streamed(agent, "What is in the picture?", max_turns=3)
    async for _ in result.stream_events():
        pass
    return result.final_output

open("answer.txt", "w").write(str(asyncio.run(main())))
'''


def test_an_agents_sdk_tool_that_returns_a_picture_shows_the_policy_a_picture(live, tmp_path):
    """The Agents SDK sends a ``ToolOutputImage`` as a ``function_call_output`` whose output is a list of parts:
    the policy's next prompt holds the picture (its pixels, its pad tokens), not its base64 as text."""
    import base64

    import numpy as np
    from PIL import Image

    from tests.envs.agent_clients import sdk_venv

    engine, _, server, _ = live
    engine.replies = ['<tool_call>{"name": "look", "arguments": {}}</tool_call>', "A red square."]
    engine.release.set()
    buf = io.BytesIO()
    Image.fromarray(np.full((28, 28, 3), (200, 30, 30), dtype=np.uint8)).save(buf, format="PNG")
    (tmp_path / "frame.b64").write_text(base64.b64encode(buf.getvalue()).decode())
    (tmp_path / "agent.py").write_text(AGENT_WITH_A_PICTURE)
    env = {"PATH": os.environ.get("PATH", ""), "OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "EMPTY",
           "OPENAI_MODEL": "policy", "OPENAI_AGENTS_DISABLE_TRACING": "1", "NO_PROXY": "*"}
    run = subprocess.run([str(sdk_venv() / "bin" / "python"), "agent.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "answer.txt").read_text() == "A red square."
    first, second = engine.asked
    pad = engine.processor.media_token_ids["image"]
    assert first.mm in (None, {}) or "pixel_values" not in first.mm
    assert "pixel_values" in second.mm and second.prompt_ids.count(pad) > 0
    assert "base64" not in engine.processor.decode(second.prompt_ids)
