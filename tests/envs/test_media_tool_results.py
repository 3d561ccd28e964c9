"""Tools that return media: the shapes a tool may return, undecodable media as a tool error, and the messages a
result becomes (media inside the tool message, or in a user message after it)."""

from __future__ import annotations

import numpy as np
import pytest

from relax_gym.envs.media_tools import Budget, check_region, check_span, png_image_part
from relax_gym.envs.tools import ToolBox, ToolCall, ToolError, tool, tool_messages
from relax_gym.omni import AudioPart, ImagePart, TextPart, VideoPart

PIXELS = np.arange(8 * 6 * 3, dtype=np.uint8).reshape(8, 6, 3)
WAVE = np.sin(np.linspace(0, 100, 8000)).astype(np.float32)


@tool
def picture() -> ImagePart:
    """A bare image part."""
    return ImagePart.of(PIXELS)


@tool
def clip_and_words() -> list:
    """Text and an audio part, in a list."""
    return ["half a second:", AudioPart.of(WAVE, rate_of_array=16000, sample_rate=16000), TextPart("(mono)")]


@tool
def late_clip() -> VideoPart:
    """A video span that starts after the clip ends."""
    frames = np.zeros((4, 8, 8, 3), np.uint8)
    return VideoPart.of(frames, fps_of_array=4.0, start_s=5.0, end_s=6.0)


@tool
def odd_list() -> list:
    """A list holding something that is neither text nor media."""
    return [ImagePart.of(PIXELS), 42]


BOX = ToolBox([picture, clip_and_words, late_clip, odd_list])


def test_a_bare_media_part_becomes_the_output():
    out = BOX.run(ToolCall("picture", {}))
    assert not out.is_error and out.text == "" and len(out.parts) == 1
    assert np.array_equal(out.parts[0].decode(), PIXELS)


def test_a_list_of_text_and_media_keeps_both():
    out = BOX.run(ToolCall("clip_and_words", {}))
    assert not out.is_error and out.text == "half a second:\n(mono)"
    assert [p.kind for p in out.parts] == ["audio"] and out.parts[0].decode().duration_s == pytest.approx(0.5)


def test_media_that_cannot_be_decoded_is_a_tool_error():
    out = BOX.run(ToolCall("late_clip", {}))
    assert out.is_error and not out.parts
    assert out.text.startswith("Error: tool late_clip returned video that cannot be decoded: requested span [5.0, 6.0)")


def test_a_list_with_something_else_is_a_tool_error():
    out = BOX.run(ToolCall("odd_list", {}))
    assert out.is_error and "returned a list holding a int" in out.text


def test_media_inside_the_tool_message_or_in_a_user_message_after_it():
    out = BOX.run(ToolCall("picture", {}))
    (inside,) = tool_messages(out, ToolCall("picture", {}))
    assert inside.role == "tool" and inside.name == "picture" and [p.kind for p in inside.content] == ["text", "image", "text"]
    text_msg, media_msg = tool_messages(out, ToolCall("picture", {}), media_role="user")
    assert text_msg.role == "tool" and not text_msg.media() and "(image in the next message)" in text_msg.text
    assert media_msg.role == "user" and media_msg.media() == out.parts
    only_text = BOX.run(ToolCall("nope", {}))
    assert len(tool_messages(only_text, ToolCall("nope", {}), media_role="user")) == 1
    with pytest.raises(ValueError, match="media_role"):
        tool_messages(out, ToolCall("picture", {}), media_role="assistant")


@pytest.mark.parametrize("args, message", [
    ((5.0, 6.0, 4.0), "start_s=5 is at or past the end of the clip (4.00 s)"),
    ((0.0, 4.5, 4.0), "end_s=4.5 is past the end"),
    ((2.0, 2.0, 4.0), "end_s=2 must be greater than start_s=2"),
])
def test_check_span_names_the_argument(args, message):
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_span(*args, what="clip")
    check_span(0.0, 4.0, 4.0, what="clip")  # the whole clip is fine


def test_check_region_accepts_the_whole_image_and_nothing_past_it():
    check_region(0, 0, 64, 48, 64, 48)
    with pytest.raises(ToolError, match="^h=49"):
        check_region(0, 0, 64, 49, 64, 48)


def test_budget_checks_before_it_takes():
    budget = Budget(total=10, per_call=6, unit="frames")
    budget.check(6, "watch()", "fewer")
    budget.take(6)
    with pytest.raises(ToolError, match="only 4 of this episode's 10 are left; fewer"):
        budget.check(5, "watch()", "fewer")
    with pytest.raises(ToolError, match="more than one call may take"):
        budget.check(7, "watch()", "fewer")
    budget.reset()
    assert budget.left == 10


def test_png_parts_are_lossless_and_deterministic():
    a, b = png_image_part(PIXELS, max_pixels=10_000), png_image_part(PIXELS.copy(), max_pixels=10_000)
    assert a == b and a.source.mime == "image/png" and np.array_equal(a.decode(), PIXELS)
