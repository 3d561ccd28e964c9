"""OpenAI-style JSON round trip of conversations (to_openai / from_openai / dumps / loads) and malformed input."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from relax_gym.omni import (
    AudioPart,
    AudioSampling,
    ConversationFormatError,
    ImagePart,
    ImageSampling,
    Message,
    TextPart,
    VideoPart,
    VideoSampling,
    dumps,
    from_openai,
    loads,
    to_openai,
)

from .media import index_frame, tone, wav_bytes


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory, clip_with_audio: Path) -> dict:
    d = tmp_path_factory.mktemp("chat json assets #1")  # spaces and '#' in the path on purpose
    image = d / "pic ü.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(image)
    audio = d / "speech%20.wav"
    sf.write(audio, tone(330.0, 0.5, 16_000), 16_000)
    return {
        "image": image,
        "video": clip_with_audio,
        "audio": audio,
        "wav": wav_bytes(tone(550.0, 0.25, 8_000), 8_000),
        "image_array": np.random.default_rng(1).integers(0, 256, (12, 20, 3), dtype=np.uint8),
        "video_array": np.stack([index_frame(i, 32, 16) for i in range(10)]),
    }


@pytest.fixture(scope="module")
def conversation(assets: dict) -> list[Message]:
    return [
        Message("system", "You are a careful assistant."),
        Message(
            "user",
            (
                TextPart("Compare these: "),
                ImagePart.of(assets["image"], max_pixels=400),
                VideoPart.of(assets["video"], fps=2.0, max_frames=4, audio=AudioSampling(sample_rate=8_000)),
                AudioPart.of(assets["audio"], sample_rate=8_000),
                AudioPart.of(assets["wav"], mime="audio/wav"),
                ImagePart.of(assets["image_array"]),
                VideoPart.of(assets["video_array"], fps_of_array=12.5, fps=5.0),
                TextPart("thanks"),
            ),
        ),
        Message("assistant", "Looking.", name="helper"),
        Message("tool", (TextPart('{"ok": true}'),), name="search", tool_call_id="call_1"),
    ]


def _decoded(part):
    out = part.decode(cache=None)
    if isinstance(part, VideoPart):
        return [out.frames, out.timestamps] + ([out.audio.waveform] if out.audio else [])
    if isinstance(part, AudioPart):
        return [out.waveform, np.array(out.sample_rate)]
    return [out]


def test_to_openai_is_json_serialisable(conversation: list[Message]) -> None:
    data = to_openai(conversation)
    text = json.dumps(data)
    assert json.loads(text) == data
    assert dumps(conversation) == text
    assert json.loads(dumps(conversation, indent=2)) == data


def test_openai_shape(conversation: list[Message], assets: dict) -> None:
    data = to_openai(conversation)
    assert [m["role"] for m in data] == ["system", "user", "assistant", "tool"]
    assert data[0]["content"] == [{"type": "text", "text": "You are a careful assistant."}]
    assert data[2]["name"] == "helper" and "tool_call_id" not in data[2]
    assert data[3]["tool_call_id"] == "call_1" and data[3]["name"] == "search"
    assert "name" not in data[0]
    text, image, video, audio, input_audio, image_arr, video_arr, text2 = data[1]["content"]
    assert text == {"type": "text", "text": "Compare these: "} and text2 == {"type": "text", "text": "thanks"}

    assert image["type"] == "image_url"
    assert image["image_url"] == {"url": assets["image"].as_uri()}
    assert image["image_url"]["url"].startswith("file:///")
    assert " " in str(assets["image"]) and "#" in str(assets["image"]) and "ü" in str(assets["image"])
    assert "#" not in image["image_url"]["url"] and " " not in image["image_url"]["url"]  # percent-encoded
    assert image["sampling"] == {"max_pixels": 400}

    assert video["type"] == "video_url" and video["video_url"] == {"url": assets["video"].as_uri()}
    assert video["sampling"]["fps"] == 2.0 and video["sampling"]["max_frames"] == 4
    assert video["sampling"]["audio"]["sample_rate"] == 8_000

    assert audio["type"] == "audio_url" and audio["audio_url"] == {"url": assets["audio"].as_uri()}

    assert input_audio["type"] == "input_audio"
    assert input_audio["input_audio"]["format"] == "wav"
    assert base64.b64decode(input_audio["input_audio"]["data"]) == assets["wav"]

    url = image_arr["image_url"]["url"]
    assert url.startswith("data:application/x-npy;base64,")
    arr = np.load(io.BytesIO(base64.b64decode(url.split(",", 1)[1])), allow_pickle=False)
    np.testing.assert_array_equal(arr, assets["image_array"])

    url = video_arr["video_url"]["url"]
    assert url.startswith("data:application/x-npy;rate=12.5;base64,")


def test_round_trip_equal(conversation: list[Message]) -> None:
    assert from_openai(to_openai(conversation)) == conversation
    back = loads(dumps(conversation))
    assert back == conversation
    assert loads(dumps(back)) == back
    assert dumps(back) == dumps(conversation)


def test_round_trip_keeps_sources_and_specs(conversation: list[Message], assets: dict) -> None:
    back = loads(dumps(conversation))
    user = back[1].content
    assert user[1].source.path == assets["image"]
    assert user[1].sampling == ImageSampling(max_pixels=400)
    assert user[2].sampling == VideoSampling(fps=2.0, max_frames=4, audio=AudioSampling(sample_rate=8_000))
    assert user[3].source.path == assets["audio"]
    assert user[4].source.data == assets["wav"]
    assert user[6].source.rate == 12.5
    assert back[2].name == "helper" and back[3].tool_call_id == "call_1"
    assert back[1].text == "Compare these: thanks"


def test_decoded_arrays_equal_after_round_trip(conversation: list[Message]) -> None:
    back = loads(dumps(conversation))
    for before, after in zip(conversation[1].content, back[1].content):
        if isinstance(before, TextPart):
            assert after == before
            continue
        assert type(after) is type(before)
        assert after.content_hash == before.content_hash
        for x, y in zip(_decoded(before), _decoded(after), strict=True):
            np.testing.assert_array_equal(x, y)


def test_content_string_becomes_text_part() -> None:
    msgs = from_openai([{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}])
    assert msgs[0].content == (TextPart("hi"),)
    assert msgs[1].content == ()


def test_openai_input_without_sampling_gets_defaults(assets: dict) -> None:
    data = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": assets["image"].as_uri()}},
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(assets["wav"]).decode(), "format": "wav"}},
                {"type": "video_url", "video_url": {"url": str(assets["video"])}},  # a bare path works too
            ],
        }
    ]
    image, audio, video = from_openai(data)[0].content
    assert image.sampling == ImageSampling() and image.source.path == assets["image"]
    assert audio.sampling == AudioSampling() and audio.source.data == assets["wav"]
    assert video.sampling == VideoSampling() and video.source.path == assets["video"]
    assert audio.decode(cache=None).duration_s == pytest.approx(0.25, abs=1e-3)


def test_image_bytes_data_url_round_trip(assets: dict) -> None:
    part = ImagePart.of(assets["image"].read_bytes(), mime="image/png")
    url = to_openai([Message("user", (part,))])[0]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    back = loads(dumps([Message("user", (part,))]))[0].content[0]
    assert back == part
    np.testing.assert_array_equal(back.decode(cache=None), part.decode(cache=None))


@pytest.mark.parametrize("rate", [16_000, 16_000.0, 22_050])
def test_array_audio_round_trip(rate: float) -> None:
    part = AudioPart.of(tone(440.0, 0.1, 16_000), rate_of_array=rate)
    back = loads(dumps([Message("user", (part,))]))[0].content[0]
    assert back == part
    assert back.content_hash == part.content_hash


def test_array_video_with_integer_fps_round_trip() -> None:
    part = VideoPart.of(np.zeros((5, 8, 8, 3), np.uint8), fps_of_array=25)
    back = loads(dumps([Message("user", (part,))]))[0].content[0]
    assert back == part


# ---------------------------------------------------------------------------------------------- malformed input


def _conv(part) -> list[dict]:
    """Two messages; the bad part is message 1, part 2."""
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, part]},
    ]


def _npy_url(payload: bytes, params: str = "") -> str:
    return f"data:application/x-npy{params};base64,{base64.b64encode(payload).decode()}"


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _npz(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, a=array)
    return buf.getvalue()


BAD_PARTS = {
    "unknown type": {"type": "image"},
    "no type": {"image_url": {"url": "file:///x.png"}},
    "part not an object": "just a string",
    "text without text": {"type": "text"},
    "text not a string": {"type": "text", "text": 5},
    "missing url object": {"type": "image_url"},
    "missing url": {"type": "video_url", "video_url": {}},
    "url not a string": {"type": "audio_url", "audio_url": {"url": 5}},
    "url object is a string": {"type": "image_url", "image_url": "file:///x.png"},
    "http url": {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}},
    "https url": {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
    "ftp url": {"type": "audio_url", "audio_url": {"url": "ftp://example.com/a.wav"}},
    "bad base64 input_audio": {"type": "input_audio", "input_audio": {"data": "!!not base64!!", "format": "wav"}},
    "input_audio without data": {"type": "input_audio", "input_audio": {"format": "wav"}},
    "input_audio not an object": {"type": "input_audio", "input_audio": "UklGRg=="},
    "bad base64 data url": {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}},
    "data url not base64": {"type": "image_url", "image_url": {"url": "data:image/png,rawtext"}},
    "data url without comma": {"type": "image_url", "image_url": {"url": "data:image/png;base64"}},
    "garbage npy": {"type": "image_url", "image_url": {"url": _npy_url(b"definitely not npy")}},
    "empty npy": {"type": "image_url", "image_url": {"url": _npy_url(b"")}},
    "zip-looking npy": {"type": "image_url", "image_url": {"url": _npy_url(b"PK\x03\x04 not really a zip")}},
    "npz archive": {"type": "image_url", "image_url": {"url": _npy_url(_npz(np.zeros((4, 4, 3), np.uint8)))}},
    "npy with bad rate": {"type": "video_url", "video_url": {"url": _npy_url(_npy(np.zeros((2, 4, 4, 3), np.uint8)), ";rate=fast")}},
    "sampling out of range": {"type": "video_url", "video_url": {"url": "file:///x.mp4"}, "sampling": {"fps": -1}},
    "sampling unknown field": {"type": "image_url", "image_url": {"url": "file:///x.png"}, "sampling": {"fps": 2}},
    "sampling wrong type": {"type": "audio_url", "audio_url": {"url": "file:///x.wav"}, "sampling": {"sample_rate": "fast"}},
    "sampling not an object": {"type": "image_url", "image_url": {"url": "file:///x.png"}, "sampling": "big"},
    "sampling inconsistent": {"type": "video_url", "video_url": {"url": "file:///x.mp4"}, "sampling": {"min_frames": 9, "max_frames": 2}},
    "input_audio bad sampling": {"type": "input_audio", "input_audio": {"data": "UklGRg=="}, "sampling": {"end_s": 0}},
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("part", list(BAD_PARTS.values()), ids=list(BAD_PARTS))
def test_malformed_part_names_message_and_part(part) -> None:
    with pytest.raises(ConversationFormatError) as info:
        from_openai(_conv(part))
    assert "message 1, part 2" in str(info.value)
    with pytest.raises(ConversationFormatError, match="message 1, part 2"):
        loads(json.dumps(_conv(part)))


BAD_MESSAGES = {
    "content a number": {"role": "user", "content": 5},
    "content null": {"role": "user", "content": None},
    "content an object": {"role": "user", "content": {"type": "text", "text": "x"}},
    "bad role": {"role": "robot", "content": "hi"},
    "no role": {"content": "hi"},
    "no content": {"role": "user"},
    "not an object": ["user", "hi"],
}


@pytest.mark.parametrize("message", list(BAD_MESSAGES.values()), ids=list(BAD_MESSAGES))
def test_malformed_message_names_message(message) -> None:
    with pytest.raises(ConversationFormatError) as info:
        from_openai([{"role": "user", "content": "ok"}, message])
    assert "message 1" in str(info.value)
    assert "part" not in str(info.value).split(":")[0]


@pytest.mark.parametrize("text", ["{", "[1, 2", "not json", ""])
def test_invalid_json(text: str) -> None:
    with pytest.raises(ConversationFormatError, match="invalid JSON"):
        loads(text)


@pytest.mark.parametrize("data", [{"role": "user", "content": "x"}, "hello", 5, None])
def test_top_level_not_a_list(data) -> None:
    with pytest.raises(ConversationFormatError, match="list"):
        from_openai(data)
    with pytest.raises(ConversationFormatError):
        loads(json.dumps(data))


def test_conversation_format_error_is_a_value_error() -> None:
    assert issubclass(ConversationFormatError, ValueError)
