"""Fuzzing the JSON form of conversations (``relax_gym.omni.loads`` / ``from_openai``).

Conversations in JSON arrive from outside: agents inside sandboxes post them to the OpenAI endpoint. Properties:
``loads`` returns messages or raises one :class:`ConversationFormatError` that says where (``message i, part j``
or the JSON line and column); it never fetches anything and never raises another type, whatever the URLs, base64
payloads, ``.npy`` headers or sampling specs hold. Conversations built from parts survive ``dumps`` → ``loads``.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relax_gym.omni import AudioPart, ImagePart, Message, TextPart, VideoPart
from relax_gym.omni.chat_json import ConversationFormatError, dumps, from_openai, loads

from .support import PARSE, TEXT_CHARS, deep_json_list, json_values, long_int, text

pytestmark = pytest.mark.timeout(120)

ROLES = ["system", "user", "assistant", "tool", "robot", ""]


def npy_url(header: dict, body: bytes = b"") -> str:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    payload = base64.b64encode(buf.getvalue() + body).decode()
    return f"data:application/x-npy;rate=16000;base64,{payload}"


urls = st.one_of(
    st.sampled_from([
        "file:///tmp/x.png", "relative/clip.mp4", "http://example.com/a.png", "ftp://h/a", "file://[x/a",
        "http://[::1", "data:image/png;base64,iVBORw0KGgo=", "data:image/png,notbase64", "data:;base64,!!!!",
        "data:application/x-npy;base64,AAAA", "data:application/x-npy;rate=abc;base64,AAAA",
        npy_url({"descr": "<f4", "fortran_order": False, "shape": (10**12,)}),
        npy_url({"descr": "<f4", "fortran_order": False, "shape": (2,)}, b"\x00" * 8),
        npy_url({"descr": "|O", "fortran_order": False, "shape": (1,)}, b"\x00" * 8),
        "data:application/x-npy;base64," + base64.b64encode(b"PK\x03\x04junk").decode(),
    ]),
    st.text(TEXT_CHARS, max_size=30),
    st.builds(lambda mime, b: f"data:{mime};base64,{base64.b64encode(b).decode()}",
              st.sampled_from(["image/png", "application/x-npy", "audio/wav", ""]), st.binary(max_size=40)),
)

sampling = st.one_of(st.none(), json_values, st.fixed_dictionaries({}, optional={
    "max_pixels": st.one_of(st.integers(-2, 10**6), json_values), "fps": st.floats(allow_nan=True),
    "start_s": st.floats(-1, 10), "end_s": st.one_of(st.none(), st.floats(-1, 10)), "sample_rate": st.integers(-1, 48000),
    "audio": json_values, "bogus": json_values}))


@st.composite
def parts(draw: st.DrawFn):
    kind = draw(st.sampled_from(["text", "image_url", "video_url", "audio_url", "input_audio", "other"]))
    if kind == "text":
        part = {"type": "text", "text": draw(st.one_of(text, json_values))}
    elif kind == "input_audio":
        part = {"type": kind, "input_audio": draw(st.one_of(json_values, st.fixed_dictionaries(
            {"data": st.one_of(st.binary(max_size=20).map(lambda b: base64.b64encode(b).decode()), json_values)},
            optional={"format": st.one_of(st.sampled_from(["wav", "mp3", "flac", "xyz"]), json_values)})))}
    elif kind == "other":
        part = draw(json_values)
        return part
    else:
        part = {"type": kind, kind: draw(st.one_of(st.fixed_dictionaries({"url": urls}), json_values))}
    if draw(st.booleans()):
        part["sampling"] = draw(sampling)
    return part


messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.one_of(st.sampled_from(ROLES), json_values),
                           "content": st.one_of(text, st.lists(parts(), max_size=3), json_values)},
                          optional={"name": json_values, "tool_call_id": json_values}),
    json_values), max_size=3)


def check(result_or_exc) -> None:
    if isinstance(result_or_exc, ConversationFormatError):
        message = str(result_or_exc)
        assert message.startswith(("message ", "invalid JSON", "a conversation must be")), message
        return
    assert all(isinstance(m, Message) for m in result_or_exc)


def run(fn, value):
    try:
        return fn(value)
    except ConversationFormatError as exc:
        assert type(exc) is ConversationFormatError
        return exc


@PARSE
@given(items=st.one_of(messages, json_values))
@example(items=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file://[x/a"}}]}])
@example(items=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": npy_url(
    {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})}}]}])
@example(items=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x.mp4"}, "sampling": [1]}]}])
@example(items=[{"role": ["user"], "content": "hi"}])
def test_from_openai_returns_messages_or_names_message_and_part(items) -> None:
    check(run(from_openai, items))
    check(run(loads, json.dumps(items)))


@PARSE
@given(raw=st.one_of(st.text(TEXT_CHARS, max_size=100), st.sampled_from([deep_json_list, long_int, "[" + long_int + "]",
                                                                        '[{"role": "user", "content": ' + long_int + "}]"])))
def test_loads_of_arbitrary_text(raw: str) -> None:
    check(run(loads, raw))


media_bytes = st.binary(min_size=1, max_size=64)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        content = []
        for _ in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["text", "image", "video", "audio", "audio_wav", "array"]))
            if kind == "text":
                content.append(TextPart(draw(text)))
            elif kind == "image":
                content.append(ImagePart.of(draw(media_bytes), mime="image/png", max_pixels=draw(st.integers(1, 10**6))))
            elif kind == "video":
                content.append(VideoPart.of(draw(media_bytes), mime="video/mp4", fps=draw(st.floats(0.1, 30))))
            elif kind == "audio_wav":
                content.append(AudioPart.of(draw(media_bytes), mime="audio/wav"))
            elif kind == "audio":
                content.append(AudioPart.of(draw(media_bytes), mime="audio/mp4"))
            else:
                wave = np.asarray(draw(st.lists(st.floats(-1, 1, width=32), min_size=1, max_size=8)), dtype=np.float32)
                content.append(AudioPart.of(wave, rate_of_array=draw(st.sampled_from([8000, 16000, 22050.5]))))
        out.append(Message(role=draw(st.sampled_from(ROLES[:4])), content=tuple(content),
                           name=draw(st.one_of(st.none(), text))))
    return out


@PARSE
@given(conv=conversations())
def test_dumps_then_loads_is_the_identity(conv: list[Message]) -> None:
    assert loads(dumps(conv)) == conv
