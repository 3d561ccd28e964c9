"""Messages to Responses API input items and back: text, a picture and a sound survive the round trip (decoded to
the same pixels and samples); a part the reader does not know is one error naming the item and the part."""

from __future__ import annotations

import numpy as np
import pytest

from relax_gym.envs.interop.responses_input import ResponsesInputError, chat_from_responses_input, to_responses_input
from relax_gym.omni import Message, from_openai
from relax_gym.omni.parts import AudioPart, ImagePart, TextPart
from relax_gym.omni.source import MediaSource


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
    back = from_openai(chat_from_responses_input(items))
    assert [m.role for m in back] == ["system", "user", "assistant"] and back[2].text == "A tone."
    assert np.array_equal(back[1].content[1].decode(), image.decode())
    assert np.abs(back[1].content[2].decode().waveform - audio.decode().waveform).max() < 1e-3  # 16-bit WAV


def test_developer_is_system_and_unknown_parts_are_named():
    assert chat_from_responses_input([{"role": "developer", "content": "x"}]) == [{"role": "system", "content": "x"}]
    with pytest.raises(ResponsesInputError, match=r"input item 1, part 0: a part of type 'input_file'"):
        chat_from_responses_input([{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "input_file"}]}])
    with pytest.raises(ResponsesInputError, match=r"input item 0: not a message with a role"):
        chat_from_responses_input([{"type": "function_call", "name": "f"}])
