"""The Responses API's requests as chat messages, and our messages as its input (relax_gym/omni/responses_api.py):
roles, items and tools map as the module says; text, a picture and a sound survive the round trip; what is not
served is one error naming the field, item and part (the route itself: tests/trainer/gateway/test_responses_route.py)."""

from __future__ import annotations

import pytest

import numpy as np

from relax_gym.omni import Message, from_openai
from relax_gym.omni.parts import AudioPart, ImagePart, TextPart
from relax_gym.omni.responses_api import (
    ResponsesRequestError,
    chat_body,
    chat_messages,
    parse_request,
    to_responses_input,
)
from relax_gym.omni.source import MediaSource


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


def test_text_image_and_audio_survive_the_round_trip():
    pixels = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    wave = np.sin(np.linspace(0, 200, 16000)).astype(np.float32) * 0.5
    image = ImagePart(MediaSource.of(pixels))
    audio = AudioPart(MediaSource.of(wave, rate=16000))
    messages = [Message("system", (TextPart("Be brief."),)), Message("user", (TextPart("What is this?"), image, audio)),
                Message("assistant", (TextPart("A tone."),))]
    items = to_responses_input(messages)
    assert [[p["type"] for p in i["content"]] for i in items] == [["input_text"], ["input_text", "input_image",
                                                                   "input_audio"], ["output_text"]]
    back = from_openai(chat_messages(items))
    assert [m.role for m in back] == ["system", "user", "assistant"] and back[2].text == "A tone."
    assert np.array_equal(back[1].content[1].decode(), image.decode())
    assert np.abs(back[1].content[2].decode().waveform - audio.decode().waveform).max() < 1e-3  # 16-bit WAV


def test_a_tool_output_with_a_picture_reaches_the_conversation_as_a_picture():
    """What the Agents SDK sends for a tool that returns ``ToolOutputImage``: the output as a list of parts."""
    pixels = np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    image = to_responses_input([Message("user", (ImagePart(MediaSource.of(pixels)),))])[0]["content"][0]
    items = [{"type": "function_call", "call_id": "c1", "name": "watch", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1",
              "output": [{"type": "input_text", "text": "frame at 0.5 s"}, image]},
             {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "only "},
                                                                          {"type": "input_text", "text": "text"}]},
             {"type": "function_call_output", "call_id": "c1", "output": {"temperature": 21}}]
    messages = chat_messages(items)
    assert [m["content"] for m in messages[2:]] == ["only text", '{"temperature": 21}']
    (tool,) = from_openai([messages[1]])
    assert tool.content[0].text == "frame at 0.5 s" and np.array_equal(tool.content[1].decode(), pixels)
    with pytest.raises(ResponsesRequestError, match=r"input\[1\].output\[0\]: content part of type 'input_file'"):
        chat_messages([items[0], {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_file"}]}])


def test_items_the_reader_cannot_use_are_named_by_item_and_part():
    assert chat_messages([{"role": "developer", "content": "x"}]) == [{"role": "system", "content": "x"}]
    with pytest.raises(ResponsesRequestError, match=r"input\[1\].content\[0\]: content part of type 'input_file'"):
        chat_messages([{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "input_file"}]}])
    with pytest.raises(ResponsesRequestError, match=r"input\[0\]: not an object"):
        chat_messages(["hello"])
