"""Video decoding through PyAV: shapes, which frames are picked, frame budgets, pixel budgets, spans, audio tracks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from relax_gym.envs.synth import write_moving_square_video
from relax_gym.omni import AudioSampling, DecodedVideo, MediaError, VideoPart, VideoSampling
from relax_gym.omni.decode import decode_video

from .media import TONE_HZ, index_frame, peak_hz, read_index, write_indexed_video

FPS = 30.0
HALF_FRAME = 0.5 / FPS


def _decode(path: Path, **sampling) -> DecodedVideo:
    return VideoPart.of(path, **sampling).decode(cache=None)


def _assert_frames_match_timestamps(video, fps: float = FPS) -> list[int]:
    """Each returned frame is the one its timestamp says (the clip encodes the frame index in the pixels)."""
    indices = [read_index(f) for f in video.frames]
    assert indices == [int(round(t * fps)) for t in video.timestamps]
    return indices


def test_frames_are_uint8_thwc(indexed_clip: Path) -> None:
    v = _decode(indexed_clip)
    assert v.frames.dtype == np.uint8
    assert v.frames.ndim == 4 and v.frames.shape[1:] == (64, 96, 3)
    assert v.timestamps.dtype == np.float64 and v.timestamps.shape == (v.frames.shape[0],)
    assert v.native_fps == pytest.approx(30.0)
    assert v.duration_s == pytest.approx(3.0, abs=1e-6)
    assert v.audio is None
    assert v.nbytes == v.frames.nbytes + v.timestamps.nbytes


def test_fps_sampling_picks_the_right_frames(indexed_clip: Path) -> None:
    v = _decode(indexed_clip, fps=2.0)
    targets = np.array([0.25, 0.75, 1.25, 1.75, 2.25, 2.75])
    assert v.frames.shape[0] == 6
    # each picked frame is the one shown nearest the target time (the two at a tie are both fine)
    np.testing.assert_allclose(v.timestamps, targets, atol=HALF_FRAME + 1e-6)
    indices = _assert_frames_match_timestamps(v)
    for i, target in zip(indices, targets):
        assert abs(i / FPS - target) <= HALF_FRAME + 1e-6
    assert np.all(np.diff(v.timestamps) > 0)


def test_fps_above_native_rate_gives_every_frame_once(indexed_clip: Path) -> None:
    v = _decode(indexed_clip, fps=120.0, max_frames=1000)
    assert v.frames.shape[0] == 90
    assert _assert_frames_match_timestamps(v) == list(range(90))


def test_max_frames_caps_and_spreads_uniformly(indexed_clip: Path) -> None:
    v = _decode(indexed_clip, fps=30.0, max_frames=10)
    assert v.frames.shape[0] == 10
    targets = 0.15 + 0.3 * np.arange(10)  # 10 frames spread over [0, 3)
    np.testing.assert_allclose(v.timestamps, targets, atol=HALF_FRAME + 1e-6)
    indices = _assert_frames_match_timestamps(v)
    gaps = np.diff(indices)
    assert gaps.min() >= 8 and gaps.max() <= 10  # ~9 frames apart everywhere: uniform, not front-loaded


def test_max_frames_below_fps_count(indexed_clip: Path) -> None:
    # 2 fps over 3 s would be 6 frames; max_frames=3 keeps 3, spread over the whole clip
    v = _decode(indexed_clip, fps=2.0, max_frames=3)
    assert v.frames.shape[0] == 3
    np.testing.assert_allclose(v.timestamps, [0.5, 1.5, 2.5], atol=HALF_FRAME + 1e-6)
    _assert_frames_match_timestamps(v)


def test_min_frames_raises_the_count(indexed_clip: Path) -> None:
    assert _decode(indexed_clip, fps=0.5).frames.shape[0] == 1  # floor(3 s * 0.5 fps)
    v = _decode(indexed_clip, fps=0.5, min_frames=4)
    assert v.frames.shape[0] == 4
    np.testing.assert_allclose(v.timestamps, 0.375 + 0.75 * np.arange(4), atol=HALF_FRAME + 1e-6)
    _assert_frames_match_timestamps(v)


def test_min_frames_never_exceeds_native_frame_count(media_dir: Path) -> None:
    path = write_indexed_video(media_dir / "five_frames.mp4", fps=10.0, frames=5, width=64, height=32)
    v = _decode(path, fps=1.0, min_frames=20, max_frames=20)
    assert v.frames.shape[0] == 5  # 0.5 s holds only 5 frames
    assert np.all(np.diff(v.timestamps) >= 0)
    _assert_frames_match_timestamps(v, fps=10.0)


def test_fps_equal_to_native_rate_gives_every_frame_once(media_dir: Path) -> None:
    path = write_indexed_video(media_dir / "five_frames_b.mp4", fps=10.0, frames=5, width=64, height=32)
    v = _decode(path, fps=10.0)
    assert _assert_frames_match_timestamps(v, fps=10.0) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("max_pixels", [1000, 96 * 64 - 1, 2000, 37])
def test_max_pixels_downsizes_keeping_aspect(indexed_clip: Path, max_pixels: int) -> None:
    v = _decode(indexed_clip, fps=2.0, max_pixels=max_pixels)
    _, h, w, c = v.frames.shape
    assert c == 3
    assert h * w <= max_pixels
    assert h < 64 and w < 96
    assert abs(w * 64 - h * 96) <= 2 * 96  # aspect 3:2 up to one-pixel rounding per side
    if max_pixels >= 1000:
        _assert_frames_match_timestamps(v)  # still the right frames after resizing
        assert h * w > max_pixels * 0.8  # not needlessly small


def test_max_pixels_never_upscales(indexed_clip: Path) -> None:
    v = _decode(indexed_clip, fps=2.0, max_pixels=10_000_000)
    assert v.frames.shape[1:] == (64, 96, 3)
    v = _decode(indexed_clip, fps=2.0, max_pixels=96 * 64)
    assert v.frames.shape[1:] == (64, 96, 3)


def test_span_selection(indexed_clip: Path) -> None:
    v = _decode(indexed_clip, fps=4.0, start_s=1.0, end_s=2.0)
    assert v.frames.shape[0] == 4
    np.testing.assert_allclose(v.timestamps, [1.125, 1.375, 1.625, 1.875], atol=HALF_FRAME + 1e-6)
    assert np.all(v.timestamps >= 1.0 - HALF_FRAME) and np.all(v.timestamps < 2.0)
    indices = _assert_frames_match_timestamps(v)
    assert all(30 <= i < 60 for i in indices)


def test_span_late_start_seeks(indexed_clip: Path) -> None:
    v = _decode(indexed_clip, fps=10.0, start_s=2.5)
    assert v.frames.shape[0] == 5
    assert np.all(v.timestamps >= 2.5 - HALF_FRAME) and np.all(v.timestamps < 3.0)
    indices = _assert_frames_match_timestamps(v)
    assert all(75 <= i < 90 for i in indices)


def test_span_end_past_video_is_clipped(indexed_clip: Path) -> None:
    v = _decode(indexed_clip, fps=2.0, start_s=2.0, end_s=50.0)
    assert v.frames.shape[0] == 2
    np.testing.assert_allclose(v.timestamps, [2.25, 2.75], atol=HALF_FRAME + 1e-6)
    _assert_frames_match_timestamps(v)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("span", [dict(start_s=5.0), dict(start_s=3.0), dict(start_s=10.0, end_s=12.0)])
def test_span_outside_video_raises(indexed_clip: Path, span: dict) -> None:
    with pytest.raises(MediaError) as info:
        _decode(indexed_clip, **span)
    assert str(indexed_clip) in str(info.value)
    assert info.value.source == str(indexed_clip)


def test_audio_track(clip_with_audio: Path) -> None:
    v = _decode(clip_with_audio, fps=2.0, audio=AudioSampling(sample_rate=16_000))
    assert v.frames.shape == (6, 64, 64, 3)
    a = v.audio
    assert a is not None
    assert a.waveform.dtype == np.float32 and a.waveform.ndim == 1
    assert a.sample_rate == 16_000
    assert a.duration_s == pytest.approx(3.0, abs=0.05)
    assert peak_hz(a.waveform, a.sample_rate) == pytest.approx(TONE_HZ, abs=3.0)
    assert 0.2 < np.abs(a.waveform).max() < 0.45  # the synth tone has amplitude 0.3
    assert not a.waveform.flags.writeable
    assert v.nbytes == v.frames.nbytes + v.timestamps.nbytes + a.waveform.nbytes


@pytest.mark.parametrize("rate", [8_000, 22_050, 48_000])
def test_audio_track_other_rates(clip_with_audio: Path, rate: int) -> None:
    a = _decode(clip_with_audio, audio=AudioSampling(sample_rate=rate)).audio
    assert a.sample_rate == rate
    assert len(a.waveform) == pytest.approx(3.0 * rate, abs=0.05 * rate)
    assert peak_hz(a.waveform, rate) == pytest.approx(TONE_HZ, abs=3.0)


def test_audio_track_follows_video_span(clip_with_audio: Path) -> None:
    v = _decode(clip_with_audio, fps=2.0, start_s=1.0, end_s=2.0, audio=AudioSampling(sample_rate=8_000))
    np.testing.assert_allclose(v.timestamps, [1.25, 1.75], atol=1 / 16 + 1e-6)
    assert v.audio.duration_s == pytest.approx(1.0, abs=1e-3)
    assert peak_hz(v.audio.waveform, 8_000) == pytest.approx(TONE_HZ, abs=3.0)


@pytest.mark.parametrize("fps", [12.5, 25.0])
def test_arbitrary_frame_rates(media_dir: Path, fps: float) -> None:
    path = media_dir / f"square_{fps}.mp4"
    write_moving_square_video(path, "down", fps=fps, frames=int(2 * fps))
    v = _decode(path, fps=4.0)
    assert v.native_fps == pytest.approx(fps)
    assert v.duration_s == pytest.approx(2.0, abs=1e-3)
    assert v.frames.shape == (8, 64, 64, 3)
    np.testing.assert_allclose(v.timestamps, 0.125 + 0.25 * np.arange(8), atol=0.5 / fps + 1e-6)


def test_unusual_frame_size(media_dir: Path) -> None:
    path = media_dir / "square_50x38.mp4"
    write_moving_square_video(path, "up", width=50, height=38, fps=12.5, frames=25)
    v = _decode(path, fps=5.0)
    assert v.frames.shape == (10, 38, 50, 3)
    assert v.duration_s == pytest.approx(2.0, abs=1e-3)
    # the red square is there: some pixel is clearly red in every frame
    red = (v.frames[..., 0] > 150) & (v.frames[..., 1] < 100) & (v.frames[..., 2] < 100)
    assert red.reshape(10, -1).any(axis=1).all()


def test_odd_frame_size(media_dir: Path) -> None:
    path = write_indexed_video(media_dir / "odd_51x37.mp4", fps=25.0, frames=50, width=51, height=37, pix_fmt="yuv444p")
    v = _decode(path, fps=2.0)
    assert v.frames.shape == (4, 37, 51, 3)
    _assert_frames_match_timestamps(v, fps=25.0)
    small = _decode(path, fps=2.0, max_pixels=500)
    assert small.frames.shape[1] * small.frames.shape[2] <= 500


def test_bytes_source_matches_path_source(indexed_clip: Path) -> None:
    from_path = _decode(indexed_clip, fps=2.0)
    from_bytes = VideoPart.of(indexed_clip.read_bytes(), fps=2.0).decode(cache=None)
    np.testing.assert_array_equal(from_path.frames, from_bytes.frames)
    np.testing.assert_array_equal(from_path.timestamps, from_bytes.timestamps)


def test_decode_video_function_directly(indexed_clip: Path) -> None:
    v = decode_video(indexed_clip, VideoSampling(fps=1.0))
    assert v.frames.shape[0] == 3
    assert _assert_frames_match_timestamps(v) in ([15, 45, 75], [14, 44, 74])  # 0.5, 1.5, 2.5 s


def test_frames_agree_with_timestamps_when_file_ends_early(media_dir: Path) -> None:
    """A file whose last frames are missing (moov first, tail cut off): when the decoder pads the missing targets,
    the frames it returns and the timestamps it reports must still describe the same frames."""
    full = write_indexed_video(media_dir / "faststart_full.mp4", faststart=True)
    data = full.read_bytes()
    cut = media_dir / "faststart_cut.mp4"
    cut.write_bytes(data[: int(len(data) * 0.8)])
    try:
        v = _decode(cut, fps=2.0)
    except MediaError:
        return  # refusing a truncated file is fine too
    _assert_frames_match_timestamps(v)


# ---------------------------------------------------------------------------------------------- array videos


def _indexed_array(n: int, width: int = 64, height: int = 32) -> np.ndarray:
    return np.stack([index_frame(i, width, height) for i in range(n)])


def test_array_video_sampling() -> None:
    frames = _indexed_array(40)  # 4 s at 10 fps
    v = VideoPart.of(frames, fps_of_array=10.0, fps=2.0).decode(cache=None)
    assert v.frames.shape == (8, 32, 64, 3)
    assert v.native_fps == 10.0 and v.duration_s == pytest.approx(4.0)
    indices = [read_index(f) for f in v.frames]
    assert indices == [int(round(t * 10)) for t in v.timestamps]
    for i, target in zip(indices, 0.25 + 0.5 * np.arange(8)):
        assert i / 10 <= target < (i + 1) / 10  # the frame on screen at the target time
    assert not v.frames.flags.writeable


def test_array_video_max_pixels_and_span() -> None:
    frames = _indexed_array(40, width=96, height=64)
    v = VideoPart.of(frames, fps_of_array=10.0, fps=2.0, start_s=1.0, end_s=3.0, max_pixels=1500).decode(cache=None)
    assert v.frames.shape[0] == 4
    assert v.frames.shape[1] * v.frames.shape[2] <= 1500
    assert np.all(v.timestamps >= 1.0 - 0.1) and np.all(v.timestamps < 3.0)
    assert [read_index(f) for f in v.frames] == [int(round(t * 10)) for t in v.timestamps]


@pytest.mark.timeout(30)
def test_array_video_span_outside_raises() -> None:
    """Like a file video, an array video asked for a span past its end must raise instead of returning frames."""
    frames = _indexed_array(10)  # 1 s at 10 fps
    with pytest.raises(MediaError):
        VideoPart.of(frames, fps_of_array=10.0, start_s=5.0).decode(cache=None)


def test_file_cut_well_before_its_declared_end_is_refused(media_dir: Path) -> None:
    """moov first, 40% of the bytes gone: the container still declares 3 s but frames stop early. Padding the
    missing half with copies of the last frame would hide a broken file, so it is a MediaError naming it."""
    full = write_indexed_video(media_dir / "faststart_full60.mp4", faststart=True)
    cut = media_dir / "faststart_cut60.mp4"
    cut.write_bytes(full.read_bytes()[: int(len(full.read_bytes()) * 0.6)])
    with pytest.raises(MediaError, match=r"faststart_cut60.mp4: video stream stops at .* \(truncated file\?\)"):
        _decode(cut, fps=2.0)
