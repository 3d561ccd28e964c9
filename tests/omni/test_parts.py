"""Message / part building blocks: validation, text, media listing, equality, summaries."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from relax_gym.omni import (
    AudioPart,
    AudioSampling,
    ImagePart,
    ImageSampling,
    Message,
    TextPart,
    VideoPart,
    VideoSampling,
    media_parts,
)

from .media import tone


@pytest.fixture
def png(tmp_path: Path) -> Path:
    path = tmp_path / "img.png"
    Image.fromarray(np.zeros((30, 50, 3), np.uint8)).save(path)
    return path


@pytest.fixture
def wav(tmp_path: Path) -> Path:
    path = tmp_path / "a.wav"
    sf.write(path, tone(440.0, 1.5, 16_000), 16_000)
    return path


@pytest.mark.parametrize("role", ["bad", "User", "", "function"])
def test_bad_role_raises(role: str) -> None:
    with pytest.raises(ValueError, match="role"):
        Message(role=role, content="x")


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_good_roles(role: str) -> None:
    assert Message(role, "x").role == role


def test_content_normalisation(png: Path) -> None:
    assert Message("user", "hello").content == (TextPart("hello"),)
    img = ImagePart.of(png)
    m = Message("user", [TextPart("a"), img])
    assert isinstance(m.content, tuple) and m.content == (TextPart("a"), img)
    assert Message("user", (p for p in [TextPart("x")])).content == (TextPart("x"),)


def test_message_text_joins_text_parts_only(png: Path) -> None:
    m = Message("user", (TextPart("look at "), ImagePart.of(png), TextPart("this")))
    assert m.text == "look at this"
    assert Message("user", (ImagePart.of(png),)).text == ""
    assert Message("assistant", "plain").text == "plain"


def test_media_parts(png: Path, wav: Path) -> None:
    img, aud = ImagePart.of(png), AudioPart.of(wav)
    vid = VideoPart.of(np.zeros((2, 8, 8, 3), np.uint8), fps_of_array=2.0)
    msgs = [
        Message("system", "sys"),
        Message("user", (TextPart("a"), img, TextPart("b"), vid)),
        Message("assistant", "ok"),
        Message("user", (aud,)),
    ]
    assert msgs[1].media() == [img, vid]
    assert media_parts(msgs) == [img, vid, aud]
    assert media_parts(tuple(msgs)) == [img, vid, aud]
    assert media_parts([]) == []


def test_array_parts_need_a_rate() -> None:
    with pytest.raises(ValueError, match="fps_of_array"):
        VideoPart.of(np.zeros((2, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="rate_of_array"):
        AudioPart.of(np.zeros(10, np.float32))
    ImagePart.of(np.zeros((8, 8, 3), np.uint8))  # images need none


def test_of_builds_sampling_specs(png: Path) -> None:
    assert ImagePart.of(png, max_pixels=100).sampling == ImageSampling(max_pixels=100)
    assert VideoPart.of(png, fps=3.0, max_frames=5).sampling == VideoSampling(fps=3.0, max_frames=5)
    assert AudioPart.of(png, sample_rate=8_000).sampling == AudioSampling(sample_rate=8_000)
    with pytest.raises(ValueError):
        VideoPart.of(png, bogus=1)
    with pytest.raises(ValueError):
        VideoPart.of(png, min_frames=5, max_frames=2)
    with pytest.raises(ValueError):
        AudioPart.of(png, start_s=2.0, end_s=1.0)
    with pytest.raises(ValueError):
        ImagePart.of(png, max_pixels=0)


def test_parts_are_frozen_and_compare_by_source_and_spec(png: Path) -> None:
    a, b = ImagePart.of(png), ImagePart.of(str(png))
    assert a == b and hash(a) == hash(b)
    assert ImagePart.of(png, max_pixels=10) != a
    with pytest.raises(AttributeError):
        a.sampling = ImageSampling()  # type: ignore[misc]
    m1 = Message("user", (TextPart("x"), a))
    m2 = Message("user", (TextPart("x"), b))
    assert m1 == m2
    assert Message("assistant", (TextPart("x"), a)) != m1
    assert ImagePart.of(png).kind == "image" and VideoPart.of(png).kind == "video" and AudioPart.of(png).kind == "audio"
    assert TextPart("x").kind == "text"


def test_text_summary() -> None:
    assert TextPart("hello").summary() == "hello"


def test_image_summary(png: Path) -> None:
    s = ImagePart.of(png).summary()
    assert "50x30" in s
    assert str(png) in s
    assert "25x15" in ImagePart.of(png, max_pixels=25 * 15).summary()


def test_video_summary(clip_with_audio: Path) -> None:
    s = VideoPart.of(clip_with_audio, fps=2.0, audio=AudioSampling(sample_rate=8_000)).summary()
    assert "6 frames" in s
    assert "64x64" in s
    assert "3.00s" in s  # clip duration
    assert "8.0 fps" in s  # native rate
    assert re.search(r"0\.2\d-2\.7\ds", s)  # span of the sampled timestamps
    assert "8000Hz" in s and "audio 3.0" in s
    assert str(clip_with_audio) in s


def test_video_array_summary() -> None:
    s = VideoPart.of(np.zeros((10, 6, 8, 3), np.uint8), fps_of_array=5.0, fps=1.0).summary()
    assert "2 frames" in s and "8x6" in s and "2.00s" in s and "5.0 fps" in s and "<array uint8 (10, 6, 8, 3)>" in s


def test_audio_summary(wav: Path) -> None:
    s = AudioPart.of(wav, sample_rate=8_000).summary()
    assert "1.50s" in s
    assert "8000 Hz" in s
    assert "12000 samples" in s
    assert str(wav) in s
