"""Fuzzing media decoding with damaged real files, and checking that nothing is left half-written.

The originals are made by ``relax_gym.envs.synth`` (an H.264 mp4 with an AAC track, the AVQA sample's JPEG and 16 kHz
WAV, and that picture saved as PNG); each example truncates, bit-flips, overwrites or splices one of them and
decodes it through the parts API, from a file and from a buffer. Properties: the decode returns well-formed
read-only arrays or raises one :class:`MediaError` naming the file (or buffer); a failed decode leaves nothing in
the decode cache and no stray file beside the input; a sample generation that dies part-way leaves no folder
behind and the next attempt produces the whole sample.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from PIL import Image

from relax_gym.envs import samples, synth
from relax_gym.omni import AudioPart, DecodeCache, ImagePart, MediaError, VideoPart
from relax_gym.omni.sampling import AudioSampling

from .support import DECODE, PARSE, mutated, scratch

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("fuzz_media")
    synth.write_moving_square_video(root / "clip.mp4", "right", fps=8.0, frames=16, with_audio_hz=440.0)
    synth.write_avqa_sample(root / "avqa", n_valid=1, n_train=1)
    jpeg = next((root / "avqa").rglob("*.jpg"))
    wav = next((root / "avqa").rglob("*.wav"))
    with Image.open(jpeg) as img:
        img.save(root / "picture.png", format="PNG")
    return {".mp4": (root / "clip.mp4").read_bytes(), ".jpg": jpeg.read_bytes(), ".wav": wav.read_bytes(),
            ".png": (root / "picture.png").read_bytes()}


def decode(suffix: str, source, cache: DecodeCache):
    """Decode ``source`` as the part its suffix calls for and check the result's shape."""
    if suffix == ".mp4":
        video = VideoPart.of(source, fps=4.0, max_frames=8, audio=AudioSampling()).decode(cache)
        assert video.frames.ndim == 4 and video.frames.shape[-1] == 3 and video.frames.dtype == np.uint8
        assert len(video.frames) == len(video.timestamps) >= 1 and not video.frames.flags.writeable
        assert video.audio is None or video.audio.waveform.dtype == np.float32
    elif suffix == ".wav":
        audio = AudioPart.of(source).decode(cache)
        assert audio.waveform.ndim == 1 and audio.waveform.dtype == np.float32 and audio.sample_rate == 16_000
        assert not audio.waveform.flags.writeable
    else:
        image = ImagePart.of(source).decode(cache)
        assert image.ndim == 3 and image.shape[-1] == 3 and image.dtype == np.uint8 and not image.flags.writeable


def wav_with(original: bytes, *, rate: int | None = None, channels: int | None = None, data_size: int | None = None) -> bytes:
    """The WAV with one header field replaced (fmt chunk at byte 12 for soundfile's PCM_16 output)."""
    data = bytearray(original)
    assert data[12:16] == b"fmt "
    if channels is not None:
        data[22:24] = struct.pack("<H", channels)
    if rate is not None:
        data[24:28] = struct.pack("<I", rate)
    if data_size is not None:
        i = data.index(b"data")
        data[i + 4 : i + 8] = struct.pack("<I", data_size)
    return bytes(data)


@st.composite
def damaged(draw: st.DrawFn, originals: dict[str, bytes]) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from(sorted(originals)))
    return suffix, draw(mutated(originals[suffix]))


@DECODE
@given(data=st.data(), from_buffer=st.booleans())
def test_damaged_media_decode_or_raise_media_error(originals, data, from_buffer: bool) -> None:
    suffix, payload = data.draw(damaged(originals))
    check_damaged(suffix, payload, from_buffer)


@pytest.mark.parametrize("field", ["rate0", "rate_huge", "rate1", "channels0", "channels_huge", "data_huge"])
def test_wav_header_fields(originals, field: str) -> None:
    wav = originals[".wav"]
    payload = {"rate0": wav_with(wav, rate=0), "rate_huge": wav_with(wav, rate=2**31 - 1), "rate1": wav_with(wav, rate=1),
               "channels0": wav_with(wav, channels=0), "channels_huge": wav_with(wav, channels=4096),
               "data_huge": wav_with(wav, data_size=2**32 - 2)}[field]
    for from_buffer in (False, True):
        check_damaged(".wav", payload, from_buffer)


def test_jpeg_claiming_a_huge_picture(originals) -> None:
    """A flipped size field in the JPEG frame header (SOF0) makes the picture claim 65535 x 65535 pixels."""
    data = bytearray(originals[".jpg"])
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = b"\xff\xff\xff\xff"
    for from_buffer in (False, True):
        check_damaged(".jpg", bytes(data), from_buffer)


def check_damaged(suffix: str, payload: bytes, from_buffer: bool) -> None:
    cache = DecodeCache(64 << 20)
    with scratch() as root:
        path = root / f"damaged{suffix}"
        path.write_bytes(payload)
        before = sorted(os.listdir(root))
        source = payload if from_buffer else path
        try:
            decode(suffix, source, cache)
        except MediaError as exc:
            assert type(exc) is MediaError
            label = f"<{len(payload)} bytes" if from_buffer else str(path)
            assert str(exc).startswith(label), f"{exc} does not name {label}"
            assert exc.source.startswith(label)
            assert cache.stats().entries == 0, "a failed decode left an entry in the cache"
        else:
            assert cache.stats().entries >= 1
        assert sorted(os.listdir(root)) == before, "decoding wrote files beside its input"
        assert path.read_bytes() == payload, "decoding changed its input"


@DECODE
@given(suffix=st.sampled_from([".mp4", ".wav", ".png", ".jpg"]), cut=st.integers(0, 100))
def test_a_repaired_file_decodes_after_a_failure(originals, suffix: str, cut: int) -> None:
    """A failure is not remembered: once the file is whole again, the same path decodes."""
    cache = DecodeCache(64 << 20)
    original = originals[suffix]
    with scratch() as root:
        path = root / f"media{suffix}"
        path.write_bytes(original[: len(original) * cut // 200])  # at most half the file
        try:
            decode(suffix, path, cache)
        except MediaError:
            pass
        path.write_bytes(original)
        decode(suffix, path, cache)


# ---------------------------------------------------------------------------------------------- sample generation


class Interrupted(BaseException):
    """Stands for a crash or a ^C in the middle of writing a sample."""


@PARSE
@given(files_before_failure=st.integers(0, 5), error=st.sampled_from([OSError, ValueError, Interrupted, KeyboardInterrupt]))
@example(files_before_failure=3, error=KeyboardInterrupt)
def test_interrupted_sample_generation_leaves_nothing_half_written(files_before_failure: int, error) -> None:
    def dying_writer(dest: Path) -> None:
        for i in range(files_before_failure):
            (dest / "videos").mkdir(exist_ok=True)
            (dest / "videos" / f"{i}.mp4").write_bytes(b"partial")
        raise error("generation died")

    def whole_writer(dest: Path) -> None:
        (dest / "val.csv").write_text("ok\n")
        (dest / "videos").mkdir()
        (dest / "videos" / "0.mp4").write_bytes(b"whole")

    with scratch() as root, pytest.MonkeyPatch.context() as mp:
        mp.setattr(samples, "_writers", lambda: {"nextqa": dying_writer})
        with pytest.raises(error):
            samples.ensure_sample("nextqa", root)
        assert os.listdir(root) == [], f"left behind: {os.listdir(root)}"
        mp.setattr(samples, "_writers", lambda: {"nextqa": whole_writer})
        final = samples.ensure_sample("nextqa", root)
        assert os.listdir(root) == [final.name]
        assert (final / "val.csv").read_text() == "ok\n" and (final / "videos" / "0.mp4").read_bytes() == b"whole"
        assert samples.ensure_sample("nextqa", root) == final  # reused, not regenerated

