"""``stream: true``: Server-Sent Events of ``chat.completion.chunk`` objects, iterated by the openai client, on the
embedded engine (the recorded ids equal a non-streamed call's) and on a scripted engine (tool-call deltas)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from relax_gym.trainer.gateway.stream import ChatStream, chunks

from .test_openai_tools import CALL_TEXT, WEATHER, openai_client, scripted  # noqa: F401 - the fixture

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def client(served):
    c = openai_client(served.server.url)
    yield c
    c.close()


def test_streamed_text_equals_the_plain_call_and_records_the_same_ids(served, client):
    plain = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0.0, user="plain")
    stream = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0.0, user="streamed",
                                            stream=True, stream_options={"include_usage": True})
    events = list(stream)
    assert all(e.object == "chat.completion.chunk" and e.id == events[0].id for e in events)
    assert events[0].choices[0].delta.role == "assistant"
    text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert text == plain.choices[0].message.content
    finishes = [e.choices[0].finish_reason for e in events if e.choices]
    assert finishes[-1] == plain.choices[0].finish_reason and not any(finishes[:-1])
    assert events[-1].choices == [] and events[-1].usage.total_tokens == plain.usage.total_tokens
    assert all(e.usage is None for e in events[:-1])
    (a,) = served.server.openai.recorder.get("plain")
    (b,) = served.server.openai.recorder.get("streamed")
    assert (a.prompt_ids, a.completion_ids) == (b.prompt_ids, b.completion_ids)
    last = events[-2].model_extra  # the finish chunk carries the training fields too
    assert last["prompt_token_ids"] == b.prompt_ids and last["relax"]["session_id"] == "streamed"


def test_sse_wire_format_and_errors_before_streaming(served):
    with httpx.Client(base_url=served.server.url, trust_env=False, timeout=60) as http:
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 4, "stream": True, "logprobs": True}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        assert r.headers["transfer-encoding"] == "chunked" and "X-Relax-Session" in r.headers
        lines = [ln for ln in r.text.split("\n\n") if ln]
        assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
        events = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
        final = events[-1]["choices"][0]
        assert len(final["logprobs"]["content"]) == len(final["token_ids"]) == len(final["token_logprobs"])
        bad = http.post("/v1/chat/completions", json={**body, "temperature": 9})
        assert bad.status_code == 400 and bad.headers["content-type"] == "application/json"
        assert bad.json()["error"]["param"] == "temperature"
        # the connection stays usable after a chunked response
        assert http.get("/v1/models").status_code == 200


def test_openai_client_raises_for_an_error_before_the_stream(served, client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10**7, stream=True)


def test_tool_call_deltas_accumulate_with_the_client_helper(scripted):  # noqa: F811 - the fixture
    scripted.engine.replies = [CALL_TEXT]
    with scripted.client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "Paris?"}],
                                                 tools=[WEATHER]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    (choice,) = final.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")


def test_chunks_cut_content_without_losing_characters():
    text = "  one two\nthree   four five six seven\teight nine  "
    completion = {"id": "c", "created": 1, "model": "m", "usage": {"total_tokens": 3}, "choices": [{
        "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    events = chunks(completion)
    pieces = [e["choices"][0]["delta"].get("content") for e in events]
    assert pieces[0] == "" and "".join(p for p in pieces if p) == text and len(pieces) > 3
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in events[-1]
    wire = b"".join(ChatStream(completion, include_usage=True))
    assert wire.endswith(b"data: [DONE]\n\n") and wire.count(b"data: ") == len(events) + 2
