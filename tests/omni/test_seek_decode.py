"""Seek-decoding (relax_gym/omni/seek.py) gives exactly the sequential decoder's frames and timestamps.

Every clip is written here with PyAV, small (64x48, a few seconds), with B-frames where the codec has them, and
decoded both ways for several sampling specs: the nearest-frame picks, their pixels and their timestamps must be
equal to the bit. The clips cover odd frame rates, variable frame rate, keyframes every 1 s / 2 s / never again,
an audio track, other containers (mkv, avi) and codecs (MPEG-4 part 2), all-intra streams, and spans.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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


def _seeking(path: Path, spec: VideoSampling, *, threads: bool = False):
    """The seek path alone (None where it declines), as decode_video runs it; ``threads``: with helper threads
    (each reopening the file) sharing the runs, as decode_video does where the cores allow."""
    with av.open(str(path)) as container:
        stream, _, _, start, _, targets = dec._probe(container, spec, str(path))
        reopen = (lambda: dec._reopen(path)) if threads else None
        return dec._pick_frames_seeking(container, stream, targets, start, spec.max_pixels, reopen=reopen)


@pytest.fixture
def three_threads(monkeypatch):
    """Room for a caller and two helper threads, however many cores this machine has."""
    monkeypatch.setattr(seek, "decode_threads", seek.DecodeThreads(3))


@pytest.mark.parametrize("clip", sorted(CLIPS))
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_seek_path_gives_the_sequential_frames_and_timestamps(clips, clip, spec, three_threads):
    sampling = SPECS[spec]
    reference = dec.decode_video(clips[clip], sampling, seek=False)
    for threads in (False, True):  # one thread decoding every run, and helper threads sharing them
        seeking = _seeking(clips[clip], sampling, threads=threads)
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


def test_a_stream_that_misbehaves_in_a_helper_thread_falls_back(clips, monkeypatch, three_threads):
    """The same with helper threads: whichever thread meets the misplanned run, the plan fails as a whole."""
    real = seek.plan_seek

    def wrong(index, targets, dt):
        plan = real(index, targets, dt)
        runs = [seek.Run(r.keyframe, (*r.picks[:-1], r.picks[-1] + 1), r.last) for r in plan.runs]  # every run is wrong
        return seek.SeekPlan(plan.target_pts, tuple(runs), plan.linear_frames, plan.seek_frames)

    monkeypatch.setattr(seek, "plan_seek", wrong)
    assert _seeking(clips["30fps_key1s_audio"], SPECS["nextqa"], threads=True) is None


def test_helpers_share_the_runs(clips, monkeypatch, three_threads):
    """With room for helpers, runs are decoded on more than one thread, each thread on its own container."""
    seen: dict[str, set[int]] = {}
    real = seek._decode_run

    def spy(container, stream, index, run, *args):
        seen.setdefault(threading.current_thread().name, set()).add(id(container))
        time.sleep(0.01)  # long enough that the helper, opening its own container meanwhile, takes runs too
        return real(container, stream, index, run, *args)

    monkeypatch.setattr(seek, "_decode_run", spy)
    spec = VideoSampling(fps=2.0, max_frames=8)  # 4 s at a keyframe a second: one run per pick
    assert _seeking(clips["30fps_key1s_audio"], spec, threads=True) is not None
    assert len(seen) >= 2
    containers = [c for ids in seen.values() for c in ids]
    assert len(containers) == len(set(containers))  # no container is shared between threads


def test_a_file_that_does_not_reopen_leaves_the_runs_to_the_caller(clips, three_threads):
    path = clips["30fps_key1s_audio"]
    sampling = SPECS["nextqa"]

    def broken():
        raise av.error.FileNotFoundError(2, "gone", str(path))

    with av.open(str(path)) as container:
        stream, _, _, start, _, targets = dec._probe(container, sampling, str(path))
        picked = dec._pick_frames_seeking(container, stream, targets, start, sampling.max_pixels, reopen=broken)
    reference = dec.decode_video(path, sampling, seek=False)
    assert picked is not None and np.array_equal(np.stack(picked[0]), reference.frames)


def test_thread_budget_never_exceeds_its_limit():
    budget = seek.DecodeThreads(3)
    assert budget.enter(5) == 2 and budget.busy == 3  # the caller and two helpers
    assert budget.enter(5) == 0 and budget.busy == 4  # a second caller decodes alone (it is running anyway)
    budget.leave(0)
    budget.leave(2)
    assert budget.busy == 0
    assert seek.DecodeThreads(1).enter(4) == 0  # one core: never a helper


def test_concurrent_decodes_stay_within_the_budget(clips, monkeypatch):
    """Decodes started from several threads at once (a decode pool's) take helpers only while the threads stay
    within the budget's limit, and each still gives the sequential decoder's frames."""
    budget = seek.DecodeThreads(2)
    monkeypatch.setattr(seek, "decode_threads", budget)
    peak = [0]
    real = seek._decode_run

    def spy(*args):
        peak[0] = max(peak[0], budget.busy)
        return real(*args)

    monkeypatch.setattr(seek, "_decode_run", spy)
    path, spec = clips["29.97fps_key2s"], VideoSampling(fps=2.0, max_frames=8)
    reference = dec.decode_video(path, spec, seek=False)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: dec.decode_video(path, spec), range(8)))
    assert all(np.array_equal(r.frames, reference.frames) for r in results)
    assert peak[0] <= 4 + 1  # four callers at most, and one helper (granted while the total was within 2)
    assert budget.busy == 0


def test_a_run_decodes_no_packet_past_its_last_pick(clips):
    """The decoder holds B-frame-reordered pictures back; a run drains it after its last needed packet instead of
    feeding it more packets (which would decode further reference frames nobody picked)."""
    path = clips["30fps_key1s_audio"]
    index = _index(path)
    plan = seek.plan_seek(index, np.array([0.45, 1.55, 2.3]), 1 / 30)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for run in plan.runs:
            fed = []
            packets = seek._seek_to(container, stream, index, run.keyframe)
            frames = list(seek._run_frames(stream, (fed.append(p) or p for p in packets), index, run, skip=True))
            assert [index.position[p.pts] for p in fed] == list(range(run.keyframe, run.last + 1))
            assert set(run.picks) <= {f.pts for f in frames}
            assert all(f.time is not None for f in frames)  # drained frames keep their time base


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_decodes_with_helpers_of_its_own(clips, three_threads):
    """A child forked after the parent used helper threads starts a pool of its own (the parent's threads do not
    exist in it) instead of waiting forever on a helper that never runs."""
    path, spec = clips["30fps_key1s_audio"], VideoSampling(fps=2.0, max_frames=8)
    assert _seeking(path, spec, threads=True) is not None  # the parent's pool is started
    reference = dec.decode_video(path, spec, seek=False)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 when it decodes the same frames with helper threads
        code = 1
        try:
            seek.decode_threads = seek.DecodeThreads(3)
            picked = _seeking(path, spec, threads=True)
            code = 0 if picked is not None and np.array_equal(np.stack(picked[0]), reference.frames) else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(code)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 60)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        assert ready, "the forked child hung"
        assert os.read(read, 1) == b"\x00"
    finally:
        os.close(read)
        os.waitpid(pid, 0)


@pytest.mark.parametrize("clip", ["30fps_key1s_audio", "mpeg4_bframes", "vfr_key15"])
def test_conversion_on_one_thread_gives_pyav_default_pixels(clips, clip):
    """Both decoders convert frames with libswscale on the calling thread (no scaler thread pool per picture); the
    pixels are those of PyAV's default conversion, at every size a spec asks for (here: shrunk, odd, unchanged)."""
    with av.open(str(clips[clip])) as container:
        frames = [f for i, f in enumerate(container.decode(video=0)) if i % 5 == 0]
    for frame in frames:
        for w, h in ((W, H), (32, 24), (27, 19), dec.fit_pixels(W, H, 50)):
            assert np.array_equal(dec._to_rgb(frame, w, h), frame.to_ndarray(format="rgb24", width=w, height=h))
