"""Decoding of media to numpy arrays: PyAV for video (and audio tracks), Pillow for images, soundfile for
wav/flac/ogg. Every failure becomes one :class:`MediaError` naming the source.

The functions here are pure (no caching); :mod:`relax_gym.omni.cache` wraps them.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np
import soundfile as sf
from PIL import Image, UnidentifiedImageError

from relax_gym.omni import seek as _seek
from relax_gym.omni.errors import MediaError
from relax_gym.omni.sampling import AudioSampling, ImageSampling, QwenVideoRule, VideoSampling

SOUNDFILE_SUFFIXES = frozenset({".wav", ".flac", ".ogg", ".oga", ".aiff", ".aif"})
_SOUNDFILE_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"FORM")


@dataclass(frozen=True)
class DecodedAudio:
    waveform: np.ndarray  # float32 (N,), mono, in [-1, 1]
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.waveform) / self.sample_rate

    @property
    def nbytes(self) -> int:
        return self.waveform.nbytes


@dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray  # uint8 (T, H, W, 3)
    timestamps: np.ndarray  # float64 (T,), seconds from the start of the file
    native_fps: float
    duration_s: float
    audio: DecodedAudio | None = None
    # the frame rate qwen-omni-utils reports for frames picked by its rule (frames / frames in span * native fps);
    # the processor's video_second_per_grid follows it. None for the uniform rule (the timestamps tell).
    sample_fps: float | None = None

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes + self.timestamps.nbytes + (self.audio.nbytes if self.audio else 0)


def fit_pixels(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """Largest (w, h) with the same aspect ratio and w*h <= max_pixels; never upscales."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    w, h = max(1, int(width * scale)), max(1, int(height * scale))
    while w * h > max_pixels:  # guard against float rounding
        w, h = max(1, w - 1), max(1, h - 1)
    return w, h


def sample_times(start_s: float, end_s: float, spec: VideoSampling, native_fps: float) -> np.ndarray:
    """Target timestamps: one every 1/fps (capped at the native rate), spread uniformly when more than
    ``max_frames`` would result and at least ``min_frames`` when the span allows it."""
    span = max(end_s - start_s, 0.0)
    fps = min(spec.fps, native_fps) if native_fps > 0 else spec.fps
    n = int(math.floor(span * fps + 1e-9))
    n = max(n, spec.min_frames, 1)
    if native_fps > 0:
        n = min(n, max(1, int(round(span * native_fps))))
    n = min(n, spec.max_frames)
    step = span / n
    return start_s + step * (np.arange(n) + 0.5) if n > 0 else np.zeros(0)


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 (T, H, W, 3) → uint8 (T, height, width, 3) as qwen-omni-utils resizes video frames:
    ``torchvision.transforms.functional.resize(video, [h, w], BICUBIC, antialias=True)`` on a uint8 tensor, which
    (torchvision's ``_functional_tensor.resize``) casts to float32, runs ``torch.nn.functional.interpolate(mode=
    "bicubic", align_corners=False, antialias=True)``, clamps to [0, 255], rounds and casts back; a frame already
    at the size is returned as is (its ``resize`` returns early). Not PIL's bicubic: the two differ by up to 9
    grey levels on detailed frames."""
    if frames.shape[1:3] == (height, width):
        return frames
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.require(frames, requirements=["C", "W"])).permute(0, 3, 1, 2).to(torch.float32)
    x = F.interpolate(x, size=[height, width], mode="bicubic", align_corners=False, antialias=True)
    x = x.clamp(min=0, max=255).round().to(torch.uint8)
    return np.ascontiguousarray(x.permute(0, 2, 3, 1).numpy())


# ---------------------------------------------------------------------------------------------- video


def decode_video(source: Path | bytes, spec: VideoSampling, *, name: str | None = None, seek: bool = True) -> DecodedVideo:
    """Decode the frames ``spec`` asks for (and its audio track, if asked). ``seek`` (the default) decodes only the
    groups of pictures that hold the picked frames when that is clearly cheaper (:mod:`relax_gym.omni.seek`);
    either way the frames and timestamps are those of the sequential decoder, which ``seek=False`` runs alone."""
    label = name or _label(source)
    try:
        picked = None
        if seek:
            with av.open(_as_file(source), mode="r") as container:
                stream, native_fps, duration, start, end, targets, qwen = _probe_plan(container, spec, label)
                try:
                    picked = _pick_frames_seeking(container, stream, targets, start, spec.max_pixels,
                                                  reopen=lambda: _reopen(source), convert=qwen.convert if qwen else None)
                except (av.FFmpegError, ValueError, IndexError):  # the sequential decoder gives the verdict
                    picked = None
        if picked is None:
            with av.open(_as_file(source), mode="r") as container:
                stream, native_fps, duration, start, end, targets, qwen = _probe_plan(container, spec, label)
                picked = _pick_frames_linear(container, stream, targets, start, spec.max_pixels, label,
                                             convert=qwen.convert if qwen else None)
        frames, stamps = picked
        if not frames:
            raise MediaError(label, "no decodable video frames in the requested span")
    except MediaError:
        raise
    except (av.FFmpegError, OSError, ValueError, IndexError) as exc:
        raise MediaError(label, f"cannot decode video: {exc}") from exc
    audio = None
    if spec.audio is not None:
        # qwen-omni-utils loads the track from video_start to video_end, or to the end of the file
        track_end = spec.audio.end_s or (spec.end_s if qwen else end)
        track_spec = spec.audio.model_copy(update={"start_s": max(spec.audio.start_s, start), "end_s": track_end})
        audio = decode_audio(source, track_spec, name=label, prefer_av=True)
    return DecodedVideo(
        frames=_readonly(np.stack(frames)),
        timestamps=_readonly(np.asarray(stamps, dtype=np.float64)),
        native_fps=native_fps,
        duration_s=duration,
        audio=audio,
        sample_fps=qwen.sample_fps if qwen else None,
    )


@dataclass(frozen=True)
class _QwenPick:
    """The qwen rule's plan for one file: the frames' size after resizing and qwen-omni-utils' sample fps."""

    height: int
    width: int
    sample_fps: float

    def convert(self, frame) -> np.ndarray:
        """A decoded frame as RGB at its native size, then resized as qwen-omni-utils resizes it."""
        rgb = frame.to_ndarray(format="rgb24", threads=1)
        return resize_frames(rgb[None], self.height, self.width)[0]


def _probe(container, spec: VideoSampling, label: str):
    """The first video stream (set to decode with threads), its native rate and duration, the span to sample and
    the target times."""
    return _probe_plan(container, spec, label)[:6]


def _probe_plan(container, spec: VideoSampling, label: str):
    """:func:`_probe` and (qwen rule) the plan of :class:`_QwenPick`, else None."""
    if not container.streams.video:
        raise MediaError(label, "no video stream in file")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    native_fps = float(stream.average_rate or stream.guessed_rate or 0.0)
    duration = _stream_duration(container, stream)
    if duration is None:
        raise MediaError(label, "video duration unknown (no stream or container duration)")
    start = min(spec.start_s, duration)
    end = duration if spec.end_s is None else min(spec.end_s, duration)
    if end <= start:
        raise MediaError(label, f"requested span [{spec.start_s}, {spec.end_s}) lies outside the video ({duration:.3f} s)")
    if spec.qwen is None:
        return stream, native_fps, duration, start, end, sample_times(start, end, spec, native_fps), None
    # qwen-omni-utils' readers index frames: torchcodec's num_frames / decord's len() -- the stream's frame count
    total = int(stream.frames or round(duration * native_fps))
    idx, sample_fps = _qwen_indices(spec, total, native_fps, label)
    first = float(stream.start_time * stream.time_base) if stream.start_time is not None and stream.time_base else 0.0
    height, width = spec.qwen.frame_size(stream.codec_context.height, stream.codec_context.width, len(idx))
    targets = first + np.asarray(idx, dtype=np.float64) / native_fps  # frame k shows at first + k / fps
    return stream, native_fps, duration, start, end, targets, _QwenPick(height, width, sample_fps)


def _qwen_indices(spec: VideoSampling, total_frames: int, video_fps: float, label: str) -> tuple[list[int], float]:
    rule: QwenVideoRule = spec.qwen  # type: ignore[assignment]
    try:
        return rule.frame_indices(total_frames, video_fps, spec.fps, spec.min_frames, spec.max_frames,
                                  spec.start_s if spec.start_s > 0 else None, spec.end_s)
    except ValueError as exc:
        raise MediaError(label, f"qwen frame rule: {exc}") from exc


def _stream_duration(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    if stream.frames and stream.average_rate:
        return stream.frames / float(stream.average_rate)
    return None


def _frame_interval(stream) -> float:
    return 1.0 / float(stream.average_rate) if stream.average_rate else 0.0


def _start_at(container, stream, start: float) -> None:
    """Where both decoders begin: the keyframe at or before ``start`` (the file's start for 0)."""
    if start > 0 and stream.time_base is not None:
        container.seek(int(start / stream.time_base), stream=stream, backward=True, any_frame=False)


def _pick_frames_seeking(container, stream, targets: np.ndarray, start: float, max_pixels: int, *, reopen=None,
                         convert=None):
    """The sequential decoder's picks, decoded by the plan of :mod:`relax_gym.omni.seek` (seeking to the groups of
    pictures that hold them, or one run from the start when they are denser than the keyframes; with ``reopen``,
    which opens the file again, the runs are shared among threads); None where no exact plan can be made or the
    stream did not behave as planned: the caller then decodes sequentially, from a freshly opened container.
    ``convert`` (a decoded frame → RGB array) replaces the default conversion to the ``max_pixels`` size."""
    _start_at(container, stream, start)
    index = _seek.scan_packets(container, stream)
    if index is None:
        return None
    plan = _seek.plan_seek(index, targets, _frame_interval(stream))
    if plan is None:
        return None
    if convert is None:
        # Every kept frame has the stream's size (decode_planned checks it), which the sequential decoder sizes all by.
        width, height = fit_pixels(stream.codec_context.width, stream.codec_context.height, max_pixels)

        def convert(frame) -> np.ndarray:
            return _to_rgb(frame, width, height)

    return _seek.decode_planned(container, stream, index, plan, convert, reopen=reopen)


def _reopen(source: Path | bytes):
    """The file opened once more and its first video stream (a seek-decoding helper thread's own)."""
    container = av.open(_as_file(source), mode="r")
    try:
        return container, container.streams.video[0]
    except BaseException:
        container.close()
        raise


def _to_rgb(frame, width: int, height: int) -> np.ndarray:
    """A decoded frame as RGB (H, W, 3) at the given size, through libswscale on this thread: PyAV's default
    (``threads=0``) gives every conversion a scaler of its own with a pool of threads started and joined for one
    small picture, which costs more than the conversion itself (and waits for those threads to be scheduled on a
    busy machine). One thread gives the same pixels."""
    return frame.to_ndarray(format="rgb24", width=width, height=height, threads=1)


def _pick_frames_linear(container, stream, targets: np.ndarray, start: float, max_pixels: int, label: str, *,
                        convert=None):
    """Decode sequentially and give each target time the nearest frame. Ties (a target exactly between two frames,
    as when sampling at the native rate) go to the earlier frame, with a margin so float rounding cannot flip them
    and pick one frame twice while skipping its neighbour. This is the reference the seeking decoder must match,
    and the fallback wherever it cannot plan."""
    _start_at(container, stream, start)
    dt = _frame_interval(stream)
    frames: list[np.ndarray] = []
    stamps: list[float] = []
    j = 0
    size: tuple[int, int] | None = None
    last_t: float | None = None
    for frame in container.decode(stream):
        if frame.time is None:
            continue
        t = float(frame.time)
        last_t = t
        if size is None:
            size = fit_pixels(frame.width, frame.height, max_pixels)
        picked = None
        while j < len(targets) and (targets[j] < t + dt * 0.5005 if dt else targets[j] <= t):
            if picked is None:
                picked = convert(frame) if convert is not None else _to_rgb(frame, size[0], size[1])
            frames.append(picked)
            stamps.append(t)
            j += 1
        if j >= len(targets):
            break
    if j < len(targets) and frames:
        # The last frame lasts until the end of the stream; a stream that stops well before the targets is a
        # truncated file, not a rounding difference.
        if last_t is None or targets[-1] > last_t + 2 * dt + 0.5:
            raise MediaError(label, f"video stream stops at {last_t or 0:.2f} s but frames are needed up to {targets[-1]:.2f} s (truncated file?)")
        while j < len(targets):
            frames.append(frames[-1])
            stamps.append(stamps[-1])
            j += 1
    return frames, stamps


def video_from_array(frames: np.ndarray, fps: float, spec: VideoSampling, *, name: str = "<array>") -> DecodedVideo:
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or frames.shape[0] == 0:
        raise MediaError(name, f"video array must be uint8 (T, H, W, 3) with T >= 1, got {frames.dtype} {frames.shape}")
    duration = frames.shape[0] / fps
    start = spec.start_s
    end = duration if spec.end_s is None else min(spec.end_s, duration)
    if end <= start:
        raise MediaError(name, f"requested span [{spec.start_s}, {spec.end_s}) lies outside the video ({duration:.3f} s)")
    if spec.qwen is not None:
        idx, sample_fps = _qwen_indices(spec, frames.shape[0], fps, name)
        height, width = spec.qwen.frame_size(frames.shape[1], frames.shape[2], len(idx))
        return DecodedVideo(
            frames=_readonly(resize_frames(frames[idx], height, width)),
            timestamps=_readonly(np.asarray(idx, dtype=np.float64) / fps),
            native_fps=fps,
            duration_s=duration,
            sample_fps=sample_fps,
        )
    targets = sample_times(start, end, spec, fps)
    idx = np.clip(np.floor(targets * fps).astype(int), 0, frames.shape[0] - 1)
    w, h = fit_pixels(frames.shape[2], frames.shape[1], spec.max_pixels)
    picked = [_resize(frames[i], w, h) for i in idx]
    return DecodedVideo(
        frames=_readonly(np.stack(picked)),
        timestamps=_readonly(idx / fps),
        native_fps=fps,
        duration_s=duration,
    )


# ---------------------------------------------------------------------------------------------- image


def decode_image(source: Path | bytes, spec: ImageSampling, *, name: str | None = None) -> np.ndarray:
    label = name or _label(source)
    try:
        with Image.open(_as_file(source)) as img:
            img.load()
            rgb = to_rgb(img)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise MediaError(label, f"cannot decode image: {exc}") from exc
    return _readonly(image_to_array(rgb, spec))


def to_rgb(img: Image.Image) -> Image.Image:
    """RGB as qwen-omni-utils' ``fetch_image`` makes it: an RGBA image is laid on white through its alpha (a bare
    ``convert("RGB")`` would drop the alpha and show what the transparent pixels hide), other modes converted."""
    if img.mode == "RGBA":
        white = Image.new("RGB", img.size, (255, 255, 255))
        white.paste(img, mask=img.split()[3])
        return white
    return img.convert("RGB")


def image_to_array(img: Image.Image, spec: ImageSampling) -> np.ndarray:
    if spec.max_pixels is None:
        return np.asarray(img, dtype=np.uint8)
    w, h = fit_pixels(img.width, img.height, spec.max_pixels)
    if (w, h) != (img.width, img.height):
        img = img.resize((w, h), Image.Resampling.BICUBIC)
    return np.asarray(img, dtype=np.uint8)


def image_from_array(array: np.ndarray, spec: ImageSampling, *, name: str = "<array>") -> np.ndarray:
    if array.ndim != 3 or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise MediaError(name, f"image array must be uint8 (H, W, 3), got {array.dtype} {array.shape}")
    return _readonly(image_to_array(Image.fromarray(array), spec))


# ---------------------------------------------------------------------------------------------- audio


def decode_audio(
    source: Path | bytes, spec: AudioSampling, *, name: str | None = None, prefer_av: bool = False
) -> DecodedAudio:
    label = name or _label(source)
    if not prefer_av and _is_soundfile(source):
        wave, rate = _read_soundfile(source, label)
    else:
        wave, rate = _read_av_audio(source, label, spec)
    return audio_from_array(wave, rate, spec, name=label)


def audio_from_array(wave: np.ndarray, rate: float, spec: AudioSampling, *, name: str = "<array>") -> DecodedAudio:
    wave = np.asarray(wave)
    if wave.ndim not in (1, 2) or not np.issubdtype(wave.dtype, np.floating):
        raise MediaError(name, f"audio array must be float (N,) or (N, C), got {wave.dtype} {wave.shape}")
    if wave.ndim == 2:  # (N, C) -> mono
        wave = wave.mean(axis=1)
    rate = int(round(rate))
    first = int(round(spec.start_s * rate))
    last = len(wave) if spec.end_s is None else min(len(wave), int(round(spec.end_s * rate)))
    last = min(last, first + int(spec.max_seconds * rate))
    if first >= len(wave) and len(wave) > 0:
        raise MediaError(name, f"start_s={spec.start_s} is past the end of the audio ({len(wave) / rate:.3f} s)")
    wave = wave[first:last]
    # Always a private copy: the result is cached read-only and must not alias the caller's array.
    try:
        wave = resample(wave, rate, spec.sample_rate) if rate != spec.sample_rate else np.array(wave, dtype=np.float32)
    except (av.FFmpegError, ValueError) as exc:  # a rate the resampler refuses (a damaged header, say)
        raise MediaError(name, f"cannot resample audio from {rate} Hz to {spec.sample_rate} Hz: {exc}") from exc
    return DecodedAudio(waveform=_readonly(np.ascontiguousarray(wave, dtype=np.float32)), sample_rate=spec.sample_rate)


def resample(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling of a mono float signal as qwen-omni-utils' ``librosa.load(sr=16000)`` does it:
    ``librosa.resample(res_type="soxr_hq")``, i.e. soxr at its high quality, the result cut or zero-padded to
    ``ceil(len * target / rate)`` samples (libswresample, which PyAV offers, differs from it by up to 2e-2 on
    noisy signals)."""
    wave = np.ascontiguousarray(wave, dtype=np.float32)
    if len(wave) == 0 or rate == target:
        return wave.copy()
    import soxr

    out = np.asarray(soxr.resample(wave, rate, target, quality="soxr_hq"), dtype=np.float32)
    n = int(np.ceil(len(wave) * float(target) / rate))
    return out[:n] if len(out) >= n else np.pad(out, (0, n - len(out)))


def _read_soundfile(source: Path | bytes, label: str) -> tuple[np.ndarray, int]:
    try:
        wave, rate = sf.read(_as_file(source), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError, TypeError) as exc:
        raise MediaError(label, f"cannot decode audio: {exc}") from exc
    return wave.mean(axis=1), rate


def _read_av_audio(source: Path | bytes, label: str, spec: AudioSampling) -> tuple[np.ndarray, int]:
    try:
        with av.open(_as_file(source), mode="r") as container:
            if not container.streams.audio:
                raise MediaError(label, "no audio stream in file")
            stream = container.streams.audio[0]
            # Decoded at the native rate and mixed down chunk by chunk (mono keeps the memory small); cut and
            # resampled afterwards (audio_from_array), in the order librosa.load mixes, cuts and resamples.
            rate = None
            converter = None
            limit_s = (spec.end_s if spec.end_s is not None else math.inf)
            limit_s = min(limit_s, spec.start_s + spec.max_seconds)
            chunks: list[np.ndarray] = []
            for frame in container.decode(stream):
                if converter is None:  # planar float at the stream's own rate and layout
                    rate = frame.sample_rate
                    converter = av.AudioResampler(format="fltp", layout=frame.layout.name, rate=rate)
                for out in converter.resample(frame):
                    chunks.append(out.to_ndarray().mean(axis=0))  # (channels, n) planar -> mean mono
                if frame.time is not None and frame.time > limit_s:
                    break
            if converter is not None:
                for out in converter.resample(None):
                    chunks.append(out.to_ndarray().mean(axis=0))
    except MediaError:
        raise
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(label, f"cannot decode audio: {exc}") from exc
    if not chunks or rate is None:
        raise MediaError(label, "audio stream holds no samples")
    return np.concatenate(chunks).astype(np.float32, copy=False), rate


# ---------------------------------------------------------------------------------------------- helpers


def _is_soundfile(source: Path | bytes) -> bool:
    if isinstance(source, bytes):
        return source[:4] in _SOUNDFILE_MAGIC
    return Path(source).suffix.lower() in SOUNDFILE_SUFFIXES


def _as_file(source: Path | bytes) -> str | BinaryIO:
    if isinstance(source, bytes):
        return io.BytesIO(source)
    path = Path(source)
    if not path.is_file():
        raise MediaError(str(path), "file not found")
    return str(path)


def _label(source: Path | bytes) -> str:
    return f"<{len(source)} bytes>" if isinstance(source, bytes) else str(source)


def _resize(frame: np.ndarray, w: int, h: int) -> np.ndarray:
    if (frame.shape[1], frame.shape[0]) == (w, h):
        return frame
    return np.asarray(Image.fromarray(frame).resize((w, h), Image.Resampling.BICUBIC))


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array
