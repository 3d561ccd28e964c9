"""Bad input becomes a MediaError naming the culprit, quickly (no hangs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from relax_gym.omni import AudioPart, AudioSampling, ImagePart, MediaError, VideoPart

pytestmark = pytest.mark.timeout(30)


def _raises_naming(path: Path, decode) -> MediaError:
    with pytest.raises(MediaError) as info:
        decode()
    assert str(path) in str(info.value)
    assert info.value.source == str(path)
    assert info.value.reason and info.value.reason in str(info.value)
    return info.value


@pytest.mark.parametrize(
    "make",
    [
        lambda p: VideoPart.of(p / "missing.mp4"),
        lambda p: ImagePart.of(p / "missing.png"),
        lambda p: AudioPart.of(p / "missing.wav"),
        lambda p: AudioPart.of(p / "missing.m4a"),
    ],
    ids=["video", "image", "wav", "m4a"],
)
@pytest.mark.parametrize("cached", [False, True])
def test_missing_file(tmp_path: Path, make, cached: bool) -> None:
    part = make(tmp_path)
    kwargs = {} if cached else {"cache": None}
    _raises_naming(part.source.path, lambda: part.decode(**kwargs))


def test_missing_file_content_hash(tmp_path: Path) -> None:
    part = VideoPart.of(tmp_path / "missing.mp4")
    _raises_naming(part.source.path, lambda: part.content_hash)


@pytest.mark.parametrize("fraction", [0.3, 0.05])
def test_truncated_mp4(tmp_path: Path, clip_with_audio: Path, fraction: float) -> None:
    data = clip_with_audio.read_bytes()
    path = tmp_path / "truncated.mp4"
    path.write_bytes(data[: int(len(data) * fraction)])
    _raises_naming(path, lambda: VideoPart.of(path).decode(cache=None))
    _raises_naming(path, lambda: VideoPart.of(path, audio=AudioSampling()).decode(cache=None))


def test_random_bytes_named_mp4(tmp_path: Path) -> None:
    path = tmp_path / "noise.mp4"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    _raises_naming(path, lambda: VideoPart.of(path).decode(cache=None))
    _raises_naming(path, lambda: AudioPart.of(path).decode(cache=None))


def test_empty_file(tmp_path: Path) -> None:
    for name in ("empty.mp4", "empty.png", "empty.wav", "empty.m4a"):
        path = tmp_path / name
        path.write_bytes(b"")
        part = {"mp4": VideoPart, "png": ImagePart}.get(name.rsplit(".", 1)[1], AudioPart).of(path)
        _raises_naming(path, lambda: part.decode(cache=None))


def test_text_named_png(tmp_path: Path) -> None:
    path = tmp_path / "not_an_image.png"
    path.write_text("this is not a picture\n" * 20)
    _raises_naming(path, lambda: ImagePart.of(path).decode(cache=None))


def test_truncated_png(tmp_path: Path) -> None:
    full = tmp_path / "full.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(full)
    path = tmp_path / "half.png"
    path.write_bytes(full.read_bytes()[: len(full.read_bytes()) // 2])
    _raises_naming(path, lambda: ImagePart.of(path).decode(cache=None))


def test_image_file_as_video(tmp_path: Path) -> None:
    path = tmp_path / "text.png"
    path.write_text("nope")
    _raises_naming(path, lambda: VideoPart.of(path).decode(cache=None))


@pytest.mark.parametrize(
    "payload",
    [
        b"RIFF" + np.random.default_rng(2).integers(0, 256, 4_000, dtype=np.uint8).tobytes(),
        np.random.default_rng(3).integers(0, 256, 4_000, dtype=np.uint8).tobytes(),
        b"fLaC" + b"\x00" * 100,
    ],
    ids=["riff-garbage", "noise", "flac-header-only"],
)
def test_corrupt_soundfile(tmp_path: Path, payload: bytes) -> None:
    suffix = ".flac" if payload.startswith(b"fLaC") else ".wav"
    path = tmp_path / f"corrupt{suffix}"
    path.write_bytes(payload)
    _raises_naming(path, lambda: AudioPart.of(path).decode(cache=None))


def test_video_without_audio_track_asked_for_audio(silent_clip: Path) -> None:
    err = _raises_naming(silent_clip, lambda: VideoPart.of(silent_clip, audio=AudioSampling()).decode(cache=None))
    assert "audio" in err.reason
    _raises_naming(silent_clip, lambda: AudioPart.of(silent_clip).decode(cache=None))


def test_bytes_source_error_names_the_buffer() -> None:
    junk = b"\x00\x01garbage" * 100
    with pytest.raises(MediaError) as info:
        VideoPart.of(junk, mime="video/mp4").decode(cache=None)
    assert f"<{len(junk)} bytes" in str(info.value)
    with pytest.raises(MediaError) as info:
        ImagePart.of(junk).decode(cache=None)
    assert f"<{len(junk)} bytes" in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "d.png").mkdir()
    _raises_naming(tmp_path / "d.png", lambda: ImagePart.of(tmp_path / "d.png").decode(cache=None))


def test_empty_array_video_raises_media_error() -> None:
    empty = np.zeros((0, 8, 8, 3), np.uint8)
    with pytest.raises(MediaError):
        VideoPart.of(empty, fps_of_array=10.0).decode(cache=None)


@pytest.mark.parametrize("array", [np.zeros((4, 8, 8), np.uint8), np.zeros((4, 8, 8, 3), np.float32)])
def test_array_video_wrong_layout(array: np.ndarray) -> None:
    with pytest.raises(MediaError, match="uint8"):
        VideoPart.of(array, fps_of_array=10.0).decode(cache=None)
