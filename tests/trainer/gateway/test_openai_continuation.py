"""Token continuity of recorded sessions: a call that replays the previous conversation and the reply it got
is rendered as ``extend(previous prompt, new turns, assistant_token_ids=previous completion)``, so each recorded
prompt is the previous prompt + completion + the new turns' ids; a call that rewrites history is rendered
afresh (``continues=False``). On a scripted tool-using agent and on the embedded engine itself."""

from __future__ import annotations

import base64
import io
import itertools

import numpy as np
import torch
from PIL import Image

from relax_gym.omni import from_openai
from relax_gym.omni.openai_tools import FunctionTool, conversation_dicts, tool_mode
from relax_gym.omni.render import render

from .test_openai_tools import WEATHER, openai_client, scripted  # noqa: F401 - the fixture

REPLIES = [
    'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    '<tool_call>{"name": "get_weather",  "arguments": {"city": "Lyon"}}</tool_call>',
    "Paris is sunny, Lyon is rainy.",
]


def assistant_of(response) -> dict:
    return response.choices[0].message.model_dump(exclude_none=True)


def test_a_tool_using_conversation_is_one_token_sequence(scripted):  # noqa: F811 - the fixture
    scripted.engine.replies = list(REPLIES)
    client = scripted.client
    messages = [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Paris and Lyon?"}]
    ask = {"model": "m", "tools": [WEATHER], "user": "trip"}
    first = client.chat.completions.create(messages=messages, **ask)
    messages += [assistant_of(first), {"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id,
                                       "content": "sunny"}]
    second = client.chat.completions.create(messages=messages, **ask)
    messages += [assistant_of(second), {"role": "tool", "tool_call_id": second.choices[0].message.tool_calls[0].id,
                                        "content": [{"type": "text", "text": "rainy"}]}]
    third = client.chat.completions.create(messages=messages, **ask)
    assert third.choices[0].message.content == REPLIES[2] and third.choices[0].finish_reason == "stop"

    calls = scripted.api.recorder.get("trip")
    assert [c.continues for c in calls] == [False, True, True]
    for prev, now in itertools.pairwise(calls):
        head = prev.prompt_ids + prev.completion_ids
        assert now.prompt_ids[:len(head)] == head and len(now.prompt_ids) > len(head)
    assert [r.model_extra["relax"]["continues"] for r in (first, second, third)] == [False, True, True]
    # the sampled ids are the canonical tokenisation here, so the extended prompt equals a fresh render of the
    # conversation with each assistant turn as the model wrote it
    tools = [FunctionTool.model_validate(WEATHER)]
    written = [dict(m) for m in messages]
    for i, text in ((2, REPLIES[0]), (4, REPLIES[1])):
        written[i] = {"role": "assistant", "content": text}
    fresh = render(from_openai(conversation_dicts(written, tools, tool_mode(tools, None))), scripted.processor)
    assert calls[2].prompt_ids == fresh.input_ids

    rewritten = [messages[0], {"role": "user", "content": "Only Lyon?"}]
    client.chat.completions.create(messages=rewritten, **ask)
    assert scripted.api.recorder.get("trip")[3].continues is False
    # an assistant message that is not what was returned breaks the chain too
    edited = [*rewritten, {"role": "assistant", "content": "Something I never said."}, {"role": "user", "content": "ok"}]
    client.chat.completions.create(messages=edited, **ask)
    assert scripted.api.recorder.get("trip")[4].continues is False


def png_data_url() -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_the_embedded_engine_continues_with_media(served):
    client = openai_client(served.server.url)
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                             {"type": "image_url", "image_url": {"url": png_data_url()}}]}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=5, user="look")
    messages += [assistant_of(first), {"role": "user", "content": "And now?"}]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=5, user="look")
    client.close()
    assert second.model_extra["relax"]["continues"] is True
    a, b = served.server.openai.recorder.get("look")
    assert b.continues and b.prompt_ids[:len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
    assert set(a.mm) == set(b.mm) and a.mm and all(torch.equal(a.mm[k], b.mm[k]) for k in a.mm)  # the same image
    assert "mm" not in b.to_json() and b.to_json()["continues"] is True
    served.server.openai.recorder.drop("look")
