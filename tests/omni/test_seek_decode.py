"""Seek-decoding (relax_gym/omni/seek.py) gives exactly the sequential decoder's frames and timestamps.

Every clip is written here with PyAV, small (64x48, a few seconds), with B-frames where the codec has them, and
decoded both ways for several sampling specs: the nearest-frame picks, their pixels and their timestamps must be
equal to the bit. The clips cover odd frame rates, variable frame rate, keyframes every 1 s / 2 s / never again,
an audio track, other containers (mkv, avi) and codecs (MPEG-4 part 2), all-intra streams, and spans.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from relax_gym.envs.synth import encode_wave
from relax_gym.omni import decode as dec
from relax_gym.omni import seek
from relax_gym.omni.errors import MediaError
from relax_gym.omni.sampling import VideoSampling

from .media import index_frame

W, H = 64, 48
HAS_X264 = "libx264" in av.codecs_available
H264 = "libx264" if HAS_X264 else "mpeg4"


def write_clip(path: Path, *, fps: float = 30.0, frames: int = 90, keyint: int = 30, codec: str = H264,
               fmt: str = "mp4", pts: list[int] | None = None, time_base: Fraction | None = None,
               audio: bool = False, bframes: int = 3, open_gop: bool = False) -> Path:
    """Frame i shows ``index_frame(i)`` above a band of fresh noise (so that no two frames are alike and P/B frames
    carry residuals). ``pts``/``time_base``: explicit presentation times (variable frame rate). ``open_gop``: MPEG-4
    B-frames may refer across keyframes (x264 clips are always closed)."""
    container = av.open(str(path), mode="w", format=fmt)
    stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
    stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
    stream.codec_context.thread_count = 1
    if time_base is not None:
        stream.codec_context.time_base = time_base
    if codec == "libx264":
        stream.options = {"preset": "veryfast", "crf": "20",
                          "x264-params": f"keyint={keyint}:min-keyint={keyint}:scenecut=0:bframes={bframes}:b-adapt=0"}
    else:
        stream.codec_context.gop_size = keyint
        stream.options = {"bf": str(min(bframes, 2)), "qscale": "3", **({} if open_gop else {"flags": "+cgop", "sc_threshold": "1000000000"})}
    astream = None
    if audio:
        astream = container.add_stream("aac", rate=16000)
        astream.layout = "mono"
    rng = np.random.default_rng(len(path.name))
    try:
        for i in range(frames):
            img = index_frame(i, W, H)
            img[H // 2:] = rng.integers(0, 256, size=(H - H // 2, W, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = pts[i] if pts is not None else i
            if time_base is not None:
                frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if astream is not None:
            seconds = (pts[-1] * time_base if pts else frames / fps)
            wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(float(seconds) * 16000)) / 16000)).astype(np.float32)
            encode_wave(container, astream, wave[None], 16000)
    finally:
        container.close()
    return path


def _vfr_pts() -> list[int]:
    rng = np.random.default_rng(7)
    return np.cumsum(np.r_[0, rng.integers(20, 70, size=79)]).tolist()  # 80 frames, 20-70 ms apart


CLIPS = {
    "30fps_key1s_audio": {"fps": 30.0, "frames": 120, "keyint": 30, "audio": True},
    "29.97fps_key2s": {"fps": 30000 / 1001, "frames": 150, "keyint": 60},
    "12.5fps_key10s": {"fps": 12.5, "frames": 75, "keyint": 125},
    "vfr_key15": {"fps": 25.0, "frames": 80, "keyint": 15, "pts": _vfr_pts(), "time_base": Fraction(1, 1000)},
    "all_intra": {"fps": 24.0, "frames": 72, "keyint": 1},
    "mkv_key1s": {"fps": 30.0, "frames": 90, "keyint": 30, "fmt": "matroska"},
    "avi_key1s": {"fps": 30.0, "frames": 90, "keyint": 30, "fmt": "avi"},
    "mpeg4_bframes": {"fps": 25.0, "frames": 100, "keyint": 25, "codec": "mpeg4"},
    "mpeg4_open_gop": {"fps": 25.0, "frames": 100, "keyint": 25, "codec": "mpeg4", "open_gop": True},
}
# The seek path must decline these (and leave them to the sequential decoder): AVI stores no presentation times (its
# packets' times run in decode order, so they say nothing about which picture a time belongs to), and open-GOP
# B-frames refer to the group of pictures before their keyframe.
MUST_DECLINE = {"avi_key1s", "mpeg4_open_gop"}
SPECS = {
    "nextqa": VideoSampling(fps=8.0, max_frames=16, min_frames=8, max_pixels=W * H),
    "sparse": VideoSampling(fps=0.5, max_frames=8),
    "three": VideoSampling(fps=2.0, max_frames=3),
    "native": VideoSampling(fps=60.0, max_frames=400),
    "span": VideoSampling(fps=3.0, start_s=1.3, end_s=2.9),
    "late_span": VideoSampling(fps=1.0, start_s=2.05),
    "downscaled": VideoSampling(fps=2.0, max_pixels=32 * 24),
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seek_clips")
    suffix = {"mp4": ".mp4", "matroska": ".mkv", "avi": ".avi"}
    return {name: write_clip(root / f"{name}{suffix[kw.get('fmt', 'mp4')]}", **kw) for name, kw in CLIPS.items()}


def _seeking(path: Path, spec: VideoSampling):
    """The seek path alone (None where it declines), as decode_video runs it."""
    with av.open(str(path)) as container:
        stream, _, _, start, _, targets = dec._probe(container, spec, str(path))
        return dec._pick_frames_seeking(container, stream, targets, start, spec.max_pixels)


@pytest.mark.parametrize("clip", sorted(CLIPS))
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_seek_path_gives_the_sequential_frames_and_timestamps(clips, clip, spec):
    sampling = SPECS[spec]
    reference = dec.decode_video(clips[clip], sampling, seek=False)
    seeking = _seeking(clips[clip], sampling)
    if clip in MUST_DECLINE:
        assert seeking is None
    else:
        assert seeking is not None, "the seek path declined a clip with trustworthy timestamps"
        frames, stamps = seeking
        assert np.array_equal(np.stack(frames), reference.frames)
        assert np.array_equal(np.asarray(stamps, dtype=np.float64), reference.timestamps)
    auto = dec.decode_video(clips[clip], sampling)
    assert np.array_equal(auto.frames, reference.frames) and np.array_equal(auto.timestamps, reference.timestamps)


def test_audio_track_comes_along_unchanged(clips):
    spec = VideoSampling(fps=2.0, audio={"sample_rate": 16000})
    a, b = dec.decode_video(clips["30fps_key1s_audio"], spec), dec.decode_video(clips["30fps_key1s_audio"], spec, seek=False)
    assert a.audio is not None and np.array_equal(a.audio.waveform, b.audio.waveform)


def _index(path: Path) -> seek.PacketIndex:
    with av.open(str(path)) as container:
        index = seek.scan_packets(container, container.streams.video[0])
    assert index is not None
    return index


def test_plan_seeks_when_picks_are_sparser_than_keyframes(clips):
    index = _index(clips["30fps_key1s_audio"])  # 4 s, a keyframe every second
    plan = seek.plan_seek(index, np.array([0.1, 1.1, 2.1, 3.1]), 1 / 30)
    assert plan.mode == "seek" and len(plan.runs) == 4
    assert [index.keyframe[r.keyframe] for r in plan.runs] == [True] * 4
    assert plan.seek_frames < plan.linear_frames


def test_plan_decodes_linearly_when_picks_are_denser_than_keyframes(clips):
    index = _index(clips["12.5fps_key10s"])  # one keyframe for the whole clip
    plan = seek.plan_seek(index, np.arange(0.1, 5.9, 0.5), 1 / 12.5)
    assert plan.mode == "linear" and len(plan.runs) == 1
    dense = seek.plan_seek(_index(clips["30fps_key1s_audio"]), np.arange(0.05, 4.0, 0.1), 1 / 30)
    assert dense.mode == "linear"  # gaps shorter than a seek's cost are decoded through


def test_nearby_picks_share_a_run(clips):
    index = _index(clips["30fps_key1s_audio"])
    plan = seek.plan_seek(index, np.array([1.1, 1.3, 1.5, 3.5]), 1 / 30)
    assert [len(r.picks) for r in plan.runs] == [3, 1]


def test_missing_timestamps_fall_back_to_the_sequential_decoder(tmp_path):
    path = write_clip(tmp_path / "raw.h264", fmt="h264", frames=30) if HAS_X264 else None
    if path is None:
        pytest.skip("needs libx264")
    with av.open(str(path)) as container:
        assert seek.scan_packets(container, container.streams.video[0]) is None  # raw H.264 has no pts
    for use_seek in (True, False):  # and neither decoder can place its frames in time
        with pytest.raises(MediaError, match="duration unknown"):
            dec.decode_video(path, VideoSampling(), seek=use_seek)


def test_a_truncated_file_fails_the_same_way(tmp_path, clips):
    faststart = tmp_path / "fast.mp4"
    with av.open(str(clips["29.97fps_key2s"])) as src, av.open(str(faststart), "w", format="mp4",
                                                                  options={"movflags": "faststart"}) as dst:
        out = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.size:
                packet.stream = out
                dst.mux(packet)
    data = faststart.read_bytes()
    cut = data[: len(data) * 2 // 3]
    spec = VideoSampling(fps=2.0)
    outcomes = []
    for use_seek in (True, False):
        try:
            v = dec.decode_video(cut, spec, seek=use_seek)
            outcomes.append((v.frames.tobytes(), v.timestamps.tobytes()))
        except MediaError as exc:
            outcomes.append(exc.reason)
    assert outcomes[0] == outcomes[1]


def test_a_stream_that_misbehaves_midway_falls_back(clips, monkeypatch):
    """A planned frame that never comes out (here: the plan asks for a pts no packet has) ends the seek path
    with None, and decode_video answers with the sequential decoder's result."""
    real = seek.plan_seek

    def wrong(index, targets, dt):
        plan = real(index, targets, dt)
        run = plan.runs[-1]
        bad = seek.Run(run.keyframe, (*run.picks[:-1], run.picks[-1] + 1), run.last)
        return seek.SeekPlan(plan.target_pts, (*plan.runs[:-1], bad), plan.linear_frames, plan.seek_frames)

    monkeypatch.setattr(seek, "plan_seek", wrong)
    spec = SPECS["nextqa"]
    assert _seeking(clips["30fps_key1s_audio"], spec) is None
    a, b = dec.decode_video(clips["30fps_key1s_audio"], spec), dec.decode_video(clips["30fps_key1s_audio"], spec, seek=False)
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.timestamps, b.timestamps)
