"""Deterministic generator of small sample datasets laid out exactly like the real ones.

The real omni-modal benchmarks (NExT-QA for video QA, EchoInk-R1's AVQA-R1-6K for audio+image QA)
are large and need a download. For smoke tests, examples and tiny RL runs we instead synthesise a
few hundred kilobytes of media *in the same on-disk layout*, so the very same dataset loaders read
either one.

The point of the synthetic content is that every answer is truly determined by the media:

* NExT-QA sample: 64x64 H.264 clips. ``TN`` rows ask which way a red square moves, and the square
  really moves that way (about 30 px over the clip) or stays still; ``DC`` rows ask how many blue
  squares there are, and the clip shows exactly that many.
* AVQA sample: a 64x64 JPEG plus a 16 kHz mono WAV. Questions ask for the number of beeps in the
  audio, the number of red circles in the picture, or whether the second tone is higher or lower
  than the first; the media carries exactly the answer.

A model can therefore only score by looking at / listening to the input, which makes the samples
suitable for checking that an RL loop learns something. Everything is derived from a seed with
``numpy.random.default_rng``; nothing touches the network.

Two more samples serve the agentic envs, where the first observation is only a coarse look and tools
fetch the rest; in each the answer sits where that first look does not reach:

* ``nextqa-agent`` (NExT-QA layout): 6 s clips at 8 fps. ``TN`` rows ask which way a red square darts:
  it rests, darts ~20 px one way and comes back within about one second that falls strictly between
  two of the four evenly spaced keyframes the env shows first (or never moves). ``DC`` rows ask how
  many blue squares flash up: they are visible for under a second, again between keyframes.
* ``avqa-agent`` (AVQA layout): 128x128 pictures and 3 s of audio, of which the env plays the first
  second up front. The beeps to count come after that second; of two tones to compare only the first
  falls in it; red circles to count are small and among orange ones of the same size, hard to tell
  apart in the low-resolution overview.

The cache of generated samples (``ensure_sample(name)``: generated on first use, reused afterwards) is
:mod:`relax_gym.envs.samples`; each sample's folder name carries its own version (``SAMPLE_VERSION``,
``AGENT_SAMPLE_VERSION`` here).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soundfile as sf
from av.video.reformatter import VideoReformatter
from PIL import Image, ImageDraw

__all__ = [
    "SAMPLE_VERSION",
    "AGENT_SAMPLE_VERSION",
    "write_nextqa_sample",
    "write_avqa_sample",
    "write_moving_square_video",
    "write_textured_video",
    "write_nextqa_agent_sample",
    "write_avqa_agent_sample",
    "write_darting_square_video",
    "write_flash_video",
    "keyframe_indices",
]

#: Bump whenever the generated content changes; the cache folder name carries it.
SAMPLE_VERSION = 4  # 2: options in a fixed order (see write_nextqa_sample); 3: 2000 / 600 training records;
# 4: nextqa's val split is 200 clips, balanced over the answers
#: The agent samples' own version (bump when their content changes; the single-turn samples keep theirs).
AGENT_SAMPLE_VERSION = 1

NEXTQA_HEADER: tuple[str, ...] = (
    "video",
    "frame_count",
    "width",
    "height",
    "question",
    "answer",
    "qid",
    "type",
    "a0",
    "a1",
    "a2",
    "a3",
    "a4",
)

DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down", "still")
_DIRECTION_OPTION = {"left": "left", "right": "right", "up": "up", "down": "down", "still": "it stays still"}
_NUMBER_WORDS: tuple[str, ...] = ("one", "two", "three", "four", "five")

TN_QUESTION = "which way does the red square move"
DC_QUESTION = "how many blue squares are there"
BEEP_QUESTION = "How many beeps do you hear?"
CIRCLE_QUESTION = "How many red circles are in the picture?"
PITCH_QUESTION = "Is the second tone higher or lower than the first?"
PITCH_OPTIONS: tuple[str, ...] = ("higher", "lower", "the same", "there is only one tone")

# Colours chosen to survive 4:2:0 chroma subsampling and JPEG/H.264 quantisation.
RED = (220, 30, 30)
BLUE = (30, 60, 230)

_SQUARE = 10  # side of the red square, px
_BLUE_SQUARE = 8  # side of the blue squares in DC clips, px
_TRAVEL = 30  # how far the red square moves over a clip, px
_MARGIN = 2  # keep shapes this far from the frame border, px

_AUDIO_SR = 16_000
_AVQA_SECONDS = 1.0
_AVQA_IMAGE = 64
_VIDEO_ID_BASE = 9_000_000_000
_VIDEOS_PER_FOLDER = 100


# --------------------------------------------------------------------------------------------
# video helpers
# --------------------------------------------------------------------------------------------


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Dark grey, slightly noisy frame (static noise, so the codec spends few bits on it)."""
    level = int(rng.integers(22, 38))
    noise = rng.integers(-3, 4, size=(height, width, 1))
    return np.clip(level + noise, 0, 255).astype(np.uint8).repeat(3, axis=2)


def _paint(frame: np.ndarray, x: int, y: int, size: int, color: tuple[int, int, int]) -> None:
    frame[y : y + size, x : x + size] = color


def _square_path(
    direction: str, rng: np.random.Generator, width: int, height: int, frames: int
) -> list[tuple[int, int]]:
    """Top-left corner of the red square for every frame."""
    travel = min(_TRAVEL, width - _SQUARE - 2 * _MARGIN, height - _SQUARE - 2 * _MARGIN)
    lo_x, hi_x = _MARGIN, width - _SQUARE - _MARGIN
    lo_y, hi_y = _MARGIN, height - _SQUARE - _MARGIN
    dx, dy = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}[direction]
    # start so that the whole path stays inside the frame
    x0 = int(rng.integers(lo_x + (travel if dx < 0 else 0), hi_x - (travel if dx > 0 else 0) + 1))
    y0 = int(rng.integers(lo_y + (travel if dy < 0 else 0), hi_y - (travel if dy > 0 else 0) + 1))
    path = []
    for i in range(frames):
        t = i / max(frames - 1, 1)
        if direction == "still":
            # at most 1 px of jitter, clamped to the frame
            jx, jy = (int(v) for v in rng.integers(-1, 2, size=2)) if i else (0, 0)
            path.append((min(max(x0 + jx, lo_x), hi_x), min(max(y0 + jy, lo_y), hi_y)))
        else:
            step = round(travel * t)
            path.append((x0 + dx * step, y0 + dy * step))
    return path


def _open_video(
    path: Path, width: int, height: int, fps: float
) -> tuple[av.container.OutputContainer, av.VideoStream]:
    container = av.open(str(path), mode="w", format="mp4")
    stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
    stream.width = width
    stream.height = height
    stream.pix_fmt = "yuv420p"
    # single-threaded, fixed preset/crf: the bitstream only depends on the input frames
    stream.codec_context.thread_count = 1
    stream.options = {"crf": "23", "preset": "veryfast"}
    return container, stream


def _write_frames(
    path: Path,
    frames: Sequence[np.ndarray] | Iterator[np.ndarray],
    *,
    width: int,
    height: int,
    fps: float,
    n_frames: int,
    with_audio_hz: float | None = None,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    container, vstream = _open_video(path, width, height, fps)
    astream = None
    if with_audio_hz is not None:
        astream = container.add_stream("aac", rate=_AUDIO_SR)
        astream.layout = "mono"
        astream.codec_context.thread_count = 1
    # one converter for the whole clip: VideoFrame.reformat makes a new swscale context for every frame (0.47 ms a
    # 64x64 frame, against 0.08 ms reusing one; the same pixels)
    to_yuv = VideoReformatter()
    try:
        for i, rgb in enumerate(frames):
            frame = to_yuv.reformat(av.VideoFrame.from_ndarray(rgb, format="rgb24"), format="yuv420p")
            frame.pts = i
            for packet in vstream.encode(frame):
                container.mux(packet)
        for packet in vstream.encode():
            container.mux(packet)
        if astream is not None:
            _encode_tone(container, astream, float(with_audio_hz), n_frames / fps)
    finally:
        container.close()


def encode_wave(container: av.container.OutputContainer, stream: av.AudioStream, wave: np.ndarray, rate: int) -> None:
    """Encode planar float audio ``wave`` (channels, n) into ``stream`` in codec-sized frames, then flush."""
    wave = np.ascontiguousarray(np.atleast_2d(wave), dtype=np.float32)
    layout = "mono" if wave.shape[0] == 1 else "stereo"
    chunk = stream.codec_context.frame_size or 1024
    for start in range(0, wave.shape[1], chunk):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave[:, start : start + chunk]), format="fltp", layout=layout)
        frame.sample_rate = rate
        frame.pts = start
        frame.time_base = Fraction(1, rate)
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def _encode_tone(
    container: av.container.OutputContainer, stream: av.AudioStream, hz: float, seconds: float
) -> None:
    t = np.arange(int(round(seconds * _AUDIO_SR)), dtype=np.float64) / _AUDIO_SR
    encode_wave(container, stream, 0.3 * np.sin(2 * np.pi * hz * t), _AUDIO_SR)


def write_moving_square_video(
    path: Path,
    direction: str,
    *,
    width: int = 64,
    height: int = 64,
    fps: float = 8.0,
    frames: int = 16,
    seed: int = 0,
    with_audio_hz: float | None = None,
) -> None:
    """Write an H.264 mp4 of a red square moving ``direction`` (left/right/up/down/still).

    The square moves about 30 px over the clip (less if the frame is too small); "still" keeps it in
    place up to 1 px of jitter. With ``with_audio_hz`` an AAC mono track carries a sine tone of that
    frequency for the same duration.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected one of {', '.join(DIRECTIONS)}")
    if width < _SQUARE + 2 * _MARGIN or height < _SQUARE + 2 * _MARGIN or width % 2 or height % 2:
        raise ValueError(f"frame size {width}x{height} must be even and at least {_SQUARE + 2 * _MARGIN} px")
    if frames < 1 or fps <= 0:
        raise ValueError("frames must be >= 1 and fps > 0")
    rng = np.random.default_rng(seed)
    background = _background(rng, height, width)
    path_xy = _square_path(direction, rng, width, height, frames)

    def gen() -> Iterator[np.ndarray]:
        for x, y in path_xy:
            frame = background.copy()
            _paint(frame, x, y, _SQUARE, RED)
            yield frame

    _write_frames(
        Path(path), gen(), width=width, height=height, fps=fps, n_frames=frames, with_audio_hz=with_audio_hz
    )


def _smooth_texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Natural-looking texture: random fields at three scales (64, 16 and 4 px cells), each upsampled bicubically,
    summed around mid grey."""
    out = np.zeros((height, width, 3), np.float32)
    for cell, amp in ((64, 90.0), (16, 40.0), (4, 18.0)):
        gh, gw = height // cell + 2, width // cell + 2
        grid = rng.normal(0.0, 1.0, size=(gh, gw, 3)).astype(np.float32)
        for c in range(3):
            up = Image.fromarray(grid[..., c]).resize((gw * cell, gh * cell), Image.Resampling.BICUBIC)
            out[..., c] += amp * np.asarray(up)[:height, :width]
    return np.clip(out + 128.0, 0, 255).astype(np.uint8)


def write_textured_video(
    path: Path,
    *,
    width: int = 640,
    height: int = 480,
    fps: float = 30.0,
    seconds: float = 20.0,
    keyframe_s: float = 2.0,
    grain: float = 5.0,
    seed: int = 0,
    preset: str = "veryfast",
) -> None:
    """Write an H.264 mp4 that costs a decoder what a camera clip costs: a textured scene panning slowly, a red
    block crossing it, and film grain (``grain``: std of the per-frame noise, in 2x2 px cells), so that P- and
    B-frames carry real residuals (about 1.2 Mbit/s at 640x480, 30 fps, grain 5) instead of the near-empty ones of
    the flat synthetic clips. Keyframes come every ``keyframe_s`` seconds exactly (no scene-cut keyframes), x264's
    default B-frames included, so decoders that seek can be measured against real-world keyframe spacing."""
    if width % 2 or height % 2 or width < 64 or height < 64:
        raise ValueError(f"frame size {width}x{height} must be even and at least 64 px")
    rng = np.random.default_rng(seed)
    n = max(1, round(seconds * fps))
    pad = 256
    texture = _smooth_texture(rng, height + pad, width + pad)
    # a few grain fields in turn: each frame's noise is new to the encoder, and none has to be drawn per frame
    grains = [np.repeat(np.repeat(rng.normal(0.0, grain, size=(height // 2, width // 2, 1)), 2, 0), 2, 1).astype(np.int16)
              for _ in range(7)]
    keyint = max(1, round(keyframe_s * fps))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    container = av.open(str(path), mode="w", format="mp4")
    stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.codec_context.thread_count = 2
    stream.options = {"crf": "23", "preset": preset, "x264-params": f"keyint={keyint}:min-keyint={keyint}:scenecut=0"}
    block = min(60, height // 4)
    try:
        for i in range(n):
            phase = 2 * np.pi * i / 300
            oy = int(pad / 2 * (1 + np.sin(phase)))
            ox = int(pad / 2 * (1 + np.cos(0.7 * phase)))
            frame = texture[oy:oy + height, ox:ox + width].astype(np.int16) + grains[i % len(grains)]
            x = (3 * i) % (width - block)
            frame[height // 2 - block // 2:height // 2 + block // 2, x:x + block] = RED
            out = av.VideoFrame.from_ndarray(np.clip(frame, 0, 255).astype(np.uint8), format="rgb24")
            out.pts = i
            for packet in stream.encode(out):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    finally:
        container.close()


def _place_boxes(
    rng: np.random.Generator, sizes: Sequence[int], width: int, height: int, gap: int
) -> list[tuple[int, int, int]]:
    """Non-overlapping square boxes ``(x, y, size)`` at least ``gap`` px apart (rejection sampling)."""
    for _ in range(1000):
        boxes: list[tuple[int, int, int]] = []
        for size in sizes:
            for _ in range(200):
                x = int(rng.integers(_MARGIN, width - size - _MARGIN + 1))
                y = int(rng.integers(_MARGIN, height - size - _MARGIN + 1))
                if all(
                    x + size + gap <= bx or bx + bs + gap <= x or y + size + gap <= by or by + bs + gap <= y
                    for bx, by, bs in boxes
                ):
                    boxes.append((x, y, size))
                    break
            else:
                break
        if len(boxes) == len(sizes):
            return boxes
    raise RuntimeError("could not place non-overlapping boxes")  # pragma: no cover


def _write_count_video(
    path: Path, n_blue: int, seed: int, *, size: int = 64, fps: float = 8.0, frames: int = 16
) -> None:
    """Static clip: one red square and ``n_blue`` blue squares, all apart from each other."""
    rng = np.random.default_rng(seed)
    frame = _background(rng, size, size)
    boxes = _place_boxes(rng, [_SQUARE] + [_BLUE_SQUARE] * n_blue, size, size, gap=4)
    (rx, ry, rs), blues = boxes[0], boxes[1:]
    _paint(frame, rx, ry, rs, RED)
    for bx, by, bs in blues:
        _paint(frame, bx, by, bs, BLUE)
    _write_frames(path, [frame] * frames, width=size, height=size, fps=fps, n_frames=frames)


# --------------------------------------------------------------------------------------------
# NExT-QA
# --------------------------------------------------------------------------------------------


def _video_slot(dest: Path, vid_map: dict[str, str], counter: int, id_base: int) -> tuple[str, Path]:
    """The ``counter``-th clip of a NExT-QA-layout sample: its video id, recorded in ``vid_map`` under its folder
    (``_VIDEOS_PER_FOLDER`` clips per folder), and the path its mp4 goes to."""
    video_id = str(id_base + counter)
    folder = f"{(counter - 1) // _VIDEOS_PER_FOLDER:04d}"
    vid_map[video_id] = f"{folder}/{video_id}"
    return video_id, dest / "videos" / folder / f"{video_id}.mp4"


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(NEXTQA_HEADER), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")


def write_nextqa_sample(dest: Path, n_val: int = 200, n_train: int = 2000, seed: int = 0, shuffle_options: bool = False) -> None:
    """Write a NExT-QA-layout sample (``val.csv``, ``train.csv``, ``map_vid_vidorID.json``, ``videos/``).

    Options come in a fixed order per question type unless ``shuffle_options``: the bundled sample exists so that
    a tiny random-init policy can learn the media -> answer map by RL in minutes on a CPU; reading shuffled
    options as well (a pointer task) is out of reach for it at that budget. Real NExT-QA data is read as it is.

    Rows alternate between ``TN`` (direction of the red square) and ``DC`` (number of blue squares);
    every row has its own 64x64, 8 fps, 16-frame H.264 clip. The training split is large (2000 clips, ~8 MB,
    ~20 s to write once): on a few hundred clips a tiny model memorises the clips (every clip has its own noisy
    background) instead of learning the concept, and its held-out accuracy stays at chance.

    The val split is balanced: each question type takes each of its five answers equally often (in turn), so a
    policy that always gives the same letter scores chance (0.2) on it, whatever the split's size; the training
    split draws its answers at random.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vid_map: dict[str, str] = {}
    counter = 0
    qid = 0
    for split, n in (("val", n_val), ("train", n_train)):
        rows: list[dict[str, object]] = []
        for i in range(n):
            counter += 1
            video_id, video_path = _video_slot(dest, vid_map, counter, _VIDEO_ID_BASE)
            clip_seed = int(rng.integers(0, 2**31 - 1))
            drawn = int(rng.integers(5))
            answer = (i // 2) % 5 if split == "val" else drawn  # val: every answer in turn, per question type
            if i % 2 == 0:
                qtype, question = "TN", TN_QUESTION
                direction = DIRECTIONS[answer]
                options = [_DIRECTION_OPTION[d] for d in DIRECTIONS]
                correct = _DIRECTION_OPTION[direction]
                write_moving_square_video(video_path, direction, seed=clip_seed)
            else:
                qtype, question = "DC", DC_QUESTION
                count = answer + 1
                options = list(_NUMBER_WORDS)
                correct = _NUMBER_WORDS[count - 1]
                _write_count_video(video_path, count, clip_seed)
            if shuffle_options:
                options = [options[k] for k in rng.permutation(len(options))]
            row: dict[str, object] = {
                "video": video_id,
                "frame_count": 16,
                "width": 64,
                "height": 64,
                "question": question,
                "answer": options.index(correct),
                "qid": qid,
                "type": qtype,
            }
            row.update({f"a{k}": opt for k, opt in enumerate(options)})
            rows.append(row)
            qid += 1
        _write_csv(dest / f"{split}.csv", rows)
    (dest / "map_vid_vidorID.json").write_text(json.dumps(vid_map, indent=1) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------
# AVQA (EchoInk-R1 AVQA-R1-6K layout)
# --------------------------------------------------------------------------------------------


def _tone(hz: float, seconds: float, amp: float = 0.5, fade: float = 0.005) -> np.ndarray:
    n = int(round(seconds * _AUDIO_SR))
    t = np.arange(n) / _AUDIO_SR
    wave = amp * np.sin(2 * np.pi * hz * t)
    k = min(int(fade * _AUDIO_SR), n // 2)
    if k:
        ramp = np.linspace(0.0, 1.0, k)
        wave[:k] *= ramp
        wave[-k:] *= ramp[::-1]
    return wave


def _silence_with_noise(rng: np.random.Generator, seconds: float, level: float = 0.003) -> np.ndarray:
    return rng.normal(0.0, level, int(round(seconds * _AUDIO_SR)))


def _place(wave: np.ndarray, clip: np.ndarray, start_s: float) -> None:
    start = int(round(start_s * _AUDIO_SR))
    wave[start : start + len(clip)] += clip


def _beeps_audio(rng: np.random.Generator, count: int) -> np.ndarray:
    wave = _silence_with_noise(rng, _AVQA_SECONDS)
    beep, gap = 0.12, float(rng.uniform(0.10, 0.13))
    t = float(rng.uniform(0.04, 0.08))
    for _ in range(count):
        _place(wave, _tone(880.0, beep), t)
        t += beep + gap
    return wave


def _hum_audio(rng: np.random.Generator) -> np.ndarray:
    base = float(rng.choice([100.0, 120.0, 150.0]))
    n = int(round(_AVQA_SECONDS * _AUDIO_SR))
    t = np.arange(n) / _AUDIO_SR
    hum = 0.15 * np.sin(2 * np.pi * base * t) + 0.05 * np.sin(2 * np.pi * 2 * base * t)
    return hum + _silence_with_noise(rng, _AVQA_SECONDS)


def _pitch_audio(rng: np.random.Generator, answer: str) -> np.ndarray:
    wave = _silence_with_noise(rng, _AVQA_SECONDS)
    first = float(rng.choice([392.0, 440.0, 494.0]))
    second = {"higher": first * 1.5, "lower": first / 1.5, "the same": first}.get(answer)
    _place(wave, _tone(first, 0.3), 0.1)
    if second is not None:
        _place(wave, _tone(second, 0.3), 0.6)
    return wave


def _random_shapes_image(rng: np.random.Generator, size: int = _AVQA_IMAGE) -> Image.Image:
    """A few random non-red shapes: filler for questions about the audio."""
    bg = tuple(int(v) for v in rng.integers(200, 246, size=3))
    img = Image.new("RGB", (size, size), bg)
    draw = ImageDraw.Draw(img)
    palette = [(40, 160, 60), (230, 200, 40), (60, 60, 200), (120, 120, 120), (150, 70, 180)]
    for _ in range(int(rng.integers(2, 5))):
        x0, y0 = (int(v) for v in rng.integers(0, size - 16, size=2))
        w, h = (int(v) for v in rng.integers(8, 17, size=2))
        color = palette[int(rng.integers(len(palette)))]
        if rng.random() < 0.5:
            draw.rectangle([x0, y0, x0 + w, y0 + h], fill=color)
        else:
            draw.ellipse([x0, y0, x0 + w, y0 + h], fill=color)
    return img


def _circles_image(rng: np.random.Generator, count: int) -> Image.Image:
    bg = tuple(int(v) for v in rng.integers(215, 246, size=3))
    img = Image.new("RGB", (_AVQA_IMAGE, _AVQA_IMAGE), bg)
    draw = ImageDraw.Draw(img)
    radius = 6
    with_square = bool(rng.random() < 0.5)
    sizes = [2 * radius + 1] * count + ([8] if with_square else [])
    boxes = _place_boxes(rng, sizes, _AVQA_IMAGE, _AVQA_IMAGE, gap=3)
    for x, y, s in boxes[:count]:
        draw.ellipse([x, y, x + s - 1, y + s - 1], fill=RED)
    if with_square:
        x, y, s = boxes[-1]
        draw.rectangle([x, y, x + s - 1, y + s - 1], fill=BLUE)
    return img


def _letter_options(options: list[str]) -> list[str]:
    return [f"{'ABCD'[k]}. {opt}" for k, opt in enumerate(options)]


def _write_avqa_split(dest: Path, split: str, n: int, rng: np.random.Generator, shuffle_options: bool = False) -> None:
    split_dir = dest / split
    (split_dir / "images").mkdir(parents=True, exist_ok=True)
    (split_dir / "audios").mkdir(parents=True, exist_ok=True)
    items: list[dict[str, object]] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            count = int(rng.integers(1, 5))
            question, options, correct = BEEP_QUESTION, list(_NUMBER_WORDS[:4]), _NUMBER_WORDS[count - 1]
            audio, image = _beeps_audio(rng, count), _random_shapes_image(rng)
        elif kind == 1:
            count = int(rng.integers(1, 5))
            question, options, correct = CIRCLE_QUESTION, list(_NUMBER_WORDS[:4]), _NUMBER_WORDS[count - 1]
            audio, image = _hum_audio(rng), _circles_image(rng, count)
        else:
            correct = PITCH_OPTIONS[int(rng.integers(len(PITCH_OPTIONS)))]
            question, options = PITCH_QUESTION, list(PITCH_OPTIONS)
            audio, image = _pitch_audio(rng, correct), _random_shapes_image(rng)
        if shuffle_options:
            options = [options[k] for k in rng.permutation(len(options))]
        letter = "ABCD"[options.index(correct)]
        image_rel, audio_rel = f"images/sample_{i}.jpg", f"audios/sample_{i}.wav"
        image.save(split_dir / image_rel, format="JPEG", quality=90)
        sf.write(split_dir / audio_rel, np.clip(audio, -1.0, 1.0), _AUDIO_SR, subtype="PCM_16", format="WAV")
        items.append(
            {
                "problem_id": i,
                "problem": question,
                "data_type": "image_audio",
                "problem_type": "multiple choice",
                "qa_type": "avqa",
                "options": _letter_options(options),
                "solution": f"<answer>{letter}</answer>",
                "path": {"image": image_rel, "audio": audio_rel},
                "data_source": "relax-gym-synth",
            }
        )
    out = split_dir / f"omni_rl_format_{split}.json"
    out.write_text(json.dumps(items, indent=1) + "\n", encoding="utf-8")


def write_avqa_sample(dest: Path, n_valid: int = 48, n_train: int = 600, seed: int = 1, shuffle_options: bool = False) -> None:
    """Write an AVQA-R1-6K-layout sample (``train/`` and ``valid/`` with json, ``images/``, ``audios/``).

    Items rotate between counting beeps (audio), counting red circles (image) and comparing the
    pitch of two tones (audio); each has four options A-D.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    _write_avqa_split(dest, "valid", n_valid, rng, shuffle_options)
    _write_avqa_split(dest, "train", n_train, rng, shuffle_options)


# --------------------------------------------------------------------------------------------
# agent samples: the answer lies where the first, coarse look does not reach
# --------------------------------------------------------------------------------------------

AGENT_CLIP_FPS = 8.0
AGENT_CLIP_FRAMES = 48  # 6 s
AGENT_KEYFRAMES = 4  # what nextqa-video-agent shows first, by default
TN_AGENT_QUESTION = "which way does the red square dart before it comes back"
DC_AGENT_QUESTION = "how many blue squares flash up"
_DART = 20  # how far the red square darts, px
_KEYFRAME_MARGIN = 1  # frames kept free of the event on each side of a keyframe

AGENT_AUDIO_SECONDS = 3.0
AGENT_EXCERPT_S = 1.0  # what echo-ink-agent plays first, by default
AGENT_IMAGE = 128
ORANGE = (235, 140, 30)


def keyframe_indices(frames: int = AGENT_CLIP_FRAMES, keyframes: int = AGENT_KEYFRAMES) -> list[int]:
    """Indices of the frames an overview of ``keyframes`` evenly spaced frames picks: the centre of each of
    ``keyframes`` equal slices of the clip (the rule of ``relax_gym.omni.decode.sample_times``)."""
    return [int(round((k + 0.5) * frames / keyframes)) for k in range(keyframes)]


def _event_window(rng: np.random.Generator, frames: int, keyframes: int, length: int) -> tuple[int, int]:
    """A run of ``length`` frames ``[a, b)`` strictly between two consecutive keyframes, with a margin."""
    keys = keyframe_indices(frames, keyframes)
    gaps = [(k0 + _KEYFRAME_MARGIN + 1, k1 - _KEYFRAME_MARGIN) for k0, k1 in zip(keys, keys[1:]) if k1 - k0 - 2 * _KEYFRAME_MARGIN - 1 >= length]
    if not gaps:
        raise ValueError(f"no gap between {keyframes} keyframes of a {frames}-frame clip holds {length} frames")
    lo, hi = gaps[int(rng.integers(len(gaps)))]
    start = int(rng.integers(lo, hi - length + 1))
    return start, start + length


def write_darting_square_video(path: Path, direction: str, *, window: tuple[int, int], width: int = 64, height: int = 64,
                               fps: float = AGENT_CLIP_FPS, frames: int = AGENT_CLIP_FRAMES, seed: int = 0) -> None:
    """Write an H.264 mp4 of a red square that rests, darts about 20 px ``direction`` during the frames
    ``window = (a, b)`` (out and back, furthest at the middle) and rests again; ``"still"`` never moves."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected one of {', '.join(DIRECTIONS)}")
    a, b = window
    if not 0 <= a < b <= frames or b - a < 3:
        raise ValueError(f"window {window} must be at least 3 frames inside 0..{frames}")
    rng = np.random.default_rng(seed)
    background = _background(rng, height, width)
    dx, dy = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}[direction]
    x0 = int(rng.integers(_MARGIN + (_DART if dx < 0 else 0), width - _SQUARE - _MARGIN - (_DART if dx > 0 else 0) + 1))
    y0 = int(rng.integers(_MARGIN + (_DART if dy < 0 else 0), height - _SQUARE - _MARGIN - (_DART if dy > 0 else 0) + 1))

    def gen() -> Iterator[np.ndarray]:
        for i in range(frames):
            reach = 0.0
            if a <= i < b:
                reach = 1.0 - abs(2.0 * (i - a) / (b - a - 1) - 1.0)
            step = round(_DART * reach)
            frame = background.copy()
            _paint(frame, x0 + dx * step, y0 + dy * step, _SQUARE, RED)
            yield frame

    _write_frames(Path(path), gen(), width=width, height=height, fps=fps, n_frames=frames)


def write_flash_video(path: Path, n_blue: int, *, window: tuple[int, int], size: int = 64, fps: float = AGENT_CLIP_FPS,
                      frames: int = AGENT_CLIP_FRAMES, seed: int = 0) -> None:
    """Write an H.264 mp4 of a resting red square and ``n_blue`` blue squares that show only during the frames
    ``window = (a, b)``, all apart from each other."""
    a, b = window
    if not 0 <= a < b <= frames:
        raise ValueError(f"window {window} must lie inside 0..{frames}")
    rng = np.random.default_rng(seed)
    plain = _background(rng, size, size)
    boxes = _place_boxes(rng, [_SQUARE] + [_BLUE_SQUARE] * n_blue, size, size, gap=4)
    (rx, ry, rs), blues = boxes[0], boxes[1:]
    _paint(plain, rx, ry, rs, RED)
    flashed = plain.copy()
    for bx, by, bs in blues:
        _paint(flashed, bx, by, bs, BLUE)
    _write_frames(Path(path), [flashed if a <= i < b else plain for i in range(frames)], width=size, height=size, fps=fps, n_frames=frames)


def write_nextqa_agent_sample(dest: Path, n_val: int = 24, n_train: int = 48, seed: int = 5, keyframes: int = AGENT_KEYFRAMES,
                              shuffle_options: bool = False) -> None:
    """Write the ``nextqa-agent`` sample in the NExT-QA layout (``val.csv``, ``train.csv``, ``map_vid_vidorID.json``,
    ``videos/``): 64x64, 8 fps, 6 s clips whose event (a dart, a flash) falls between the ``keyframes`` evenly
    spaced keyframes an overview shows. Rows alternate between ``TN`` (which way the red square darts, or that it
    stays still) and ``DC`` (how many blue squares flash up)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vid_map: dict[str, str] = {}
    counter = qid = 0
    for split, n in (("val", n_val), ("train", n_train)):
        rows: list[dict[str, object]] = []
        for i in range(n):
            counter += 1
            video_id, video_path = _video_slot(dest, vid_map, counter, _VIDEO_ID_BASE + 500_000)
            clip_seed = int(rng.integers(0, 2**31 - 1))
            if i % 2 == 0:
                qtype, question = "TN", TN_AGENT_QUESTION
                direction = DIRECTIONS[int(rng.integers(len(DIRECTIONS)))]
                options = [_DIRECTION_OPTION[d] for d in DIRECTIONS]
                correct = _DIRECTION_OPTION[direction]
                window = _event_window(rng, AGENT_CLIP_FRAMES, keyframes, int(rng.integers(7, 10)))
                write_darting_square_video(video_path, direction, window=window, seed=clip_seed)
            else:
                qtype, question = "DC", DC_AGENT_QUESTION
                count = int(rng.integers(1, 6))
                options = list(_NUMBER_WORDS)
                correct = _NUMBER_WORDS[count - 1]
                window = _event_window(rng, AGENT_CLIP_FRAMES, keyframes, int(rng.integers(5, 8)))
                write_flash_video(video_path, count, window=window, seed=clip_seed)
            if shuffle_options:
                options = [options[k] for k in rng.permutation(len(options))]
            row: dict[str, object] = {"video": video_id, "frame_count": AGENT_CLIP_FRAMES, "width": 64, "height": 64,
                                      "question": question, "answer": options.index(correct), "qid": qid, "type": qtype}
            row.update({f"a{k}": opt for k, opt in enumerate(options)})
            rows.append(row)
            qid += 1
        _write_csv(dest / f"{split}.csv", rows)
    (dest / "map_vid_vidorID.json").write_text(json.dumps(vid_map, indent=1) + "\n", encoding="utf-8")


def _hum(rng: np.random.Generator, seconds: float, amp: float = 0.05) -> np.ndarray:
    """A quiet mains-like hum plus noise: never silent, never decisive."""
    n = int(round(seconds * _AUDIO_SR))
    t = np.arange(n) / _AUDIO_SR
    return amp * np.sin(2 * np.pi * float(rng.choice([100.0, 120.0, 150.0])) * t) + _silence_with_noise(rng, seconds)


def _late_beeps_audio(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` beeps, all after the excerpt the env plays first."""
    wave = _hum(rng, AGENT_AUDIO_SECONDS)
    beep, gap = 0.12, float(rng.uniform(0.10, 0.14))
    latest = AGENT_AUDIO_SECONDS - count * (beep + gap) - 0.05
    t = float(rng.uniform(AGENT_EXCERPT_S + 0.2, max(latest, AGENT_EXCERPT_S + 0.2)))
    for _ in range(count):
        _place(wave, _tone(880.0, beep), t)
        t += beep + gap
    return wave


def _late_pitch_audio(rng: np.random.Generator, answer: str) -> np.ndarray:
    """The first tone inside the excerpt, the second (if any) well after it."""
    wave = _hum(rng, AGENT_AUDIO_SECONDS)
    first = float(rng.choice([392.0, 440.0, 494.0]))
    second = {"higher": first * 1.5, "lower": first / 1.5, "the same": first}.get(answer)
    _place(wave, _tone(first, 0.3), float(rng.uniform(0.2, AGENT_EXCERPT_S - 0.4)))
    if second is not None:
        _place(wave, _tone(second, 0.3), float(rng.uniform(AGENT_EXCERPT_S + 0.4, AGENT_AUDIO_SECONDS - 0.4)))
    return wave


def _small_circles_image(rng: np.random.Generator, count: int) -> Image.Image:
    """``count`` small red circles among orange ones of the same size on a 128x128 picture: countable at full
    size, a few smeared warm dots at 32x32."""
    bg = tuple(int(v) for v in rng.integers(215, 246, size=3))
    img = Image.new("RGB", (AGENT_IMAGE, AGENT_IMAGE), bg)
    draw = ImageDraw.Draw(img)
    n_orange = int(rng.integers(2, 5))
    boxes = _place_boxes(rng, [7] * (count + n_orange), AGENT_IMAGE, AGENT_IMAGE, gap=6)
    for k, (x, y, s) in enumerate(boxes):
        draw.ellipse([x, y, x + s - 1, y + s - 1], fill=RED if k < count else ORANGE)
    return img


def _save_avqa_item(split_dir: Path, i: int, question: str, options: list[str], correct: str, image: Image.Image,
                    audio: np.ndarray) -> dict[str, object]:
    """Write one item's JPEG and 16 kHz WAV and return its AVQA-R1 record."""
    image_rel, audio_rel = f"images/sample_{i}.jpg", f"audios/sample_{i}.wav"
    image.save(split_dir / image_rel, format="JPEG", quality=90)
    sf.write(split_dir / audio_rel, np.clip(audio, -1.0, 1.0), _AUDIO_SR, subtype="PCM_16", format="WAV")
    return {
        "problem_id": i,
        "problem": question,
        "data_type": "image_audio",
        "problem_type": "multiple choice",
        "qa_type": "avqa",
        "options": _letter_options(options),
        "solution": f"<answer>{'ABCD'[options.index(correct)]}</answer>",
        "path": {"image": image_rel, "audio": audio_rel},
        "data_source": "relax-gym-synth",
    }


def write_avqa_agent_sample(dest: Path, n_valid: int = 24, n_train: int = 48, seed: int = 6, shuffle_options: bool = False) -> None:
    """Write the ``avqa-agent`` sample in the AVQA-R1-6K layout (``train/`` and ``valid/`` with their json,
    ``images/`` and ``audios/``): 128x128 JPEGs and 3 s WAVs. Items rotate between counting beeps that come after
    the first second, comparing a tone in the first second with one after it, and counting small red circles
    among orange ones; each has four options A-D."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, n in (("valid", n_valid), ("train", n_train)):
        split_dir = dest / split
        (split_dir / "images").mkdir(parents=True, exist_ok=True)
        (split_dir / "audios").mkdir(parents=True, exist_ok=True)
        items = []
        for i in range(n):
            kind = i % 3
            if kind == 0:
                count = int(rng.integers(1, 5))
                question, options, correct = BEEP_QUESTION, list(_NUMBER_WORDS[:4]), _NUMBER_WORDS[count - 1]
                audio, image = _late_beeps_audio(rng, count), _random_shapes_image(rng, AGENT_IMAGE)
            elif kind == 1:
                count = int(rng.integers(1, 5))
                question, options, correct = CIRCLE_QUESTION, list(_NUMBER_WORDS[:4]), _NUMBER_WORDS[count - 1]
                audio, image = _hum(rng, AGENT_AUDIO_SECONDS), _small_circles_image(rng, count)
            else:
                correct = PITCH_OPTIONS[int(rng.integers(len(PITCH_OPTIONS)))]
                question, options = PITCH_QUESTION, list(PITCH_OPTIONS)
                audio, image = _late_pitch_audio(rng, correct), _random_shapes_image(rng, AGENT_IMAGE)
            if shuffle_options:
                options = [options[k] for k in rng.permutation(len(options))]
            items.append(_save_avqa_item(split_dir, i, question, options, correct, image, audio))
        (split_dir / f"omni_rl_format_{split}.json").write_text(json.dumps(items, indent=1) + "\n", encoding="utf-8")
