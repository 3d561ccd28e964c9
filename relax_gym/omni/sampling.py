"""Sampling specs: how a media part is turned into arrays (frame rate, frame budget, pixel budget, audio rate).

Specs are frozen pydantic models so they hash and serialise; the decode cache keys on ``(content hash, spec)``.
"""

from __future__ import annotations

import math
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def cache_key(self) -> str:
        return f"{type(self).__name__}:{self.model_dump_json()}"


class ImageSampling(_Spec):
    """Images are resized (aspect kept) so that height*width <= ``max_pixels``; never upscaled. ``None`` keeps the
    decoded size and leaves all sizing to the processor: the official path, where qwen-omni-utils' ``fetch_image``
    resizes once, to the processor's ``smart_resize`` size (a cap here would resize twice)."""

    max_pixels: int | None = Field(default=512 * 512, gt=0)


class AudioSampling(_Spec):
    """Audio is mixed to mono, resampled to ``sample_rate`` and cut to ``[start_s, end_s)``."""

    sample_rate: int = Field(default=16_000, gt=0)
    start_s: float = Field(default=0.0, ge=0.0)
    end_s: float | None = Field(default=None, gt=0.0)
    max_seconds: float = Field(default=600.0, gt=0.0)

    @model_validator(mode="after")
    def _span(self) -> Self:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be greater than start_s ({self.start_s})")
        return self


# qwen-omni-utils 0.0.9 (qwen_omni_utils/v2_5/vision_process.py): the module constants its fetch_video uses
QWEN_FRAME_FACTOR = 2  # FRAME_FACTOR: frame counts are even (the temporal patch)
QWEN_FPS_MIN_FRAMES = 4  # FPS_MIN_FRAMES
QWEN_FPS_MAX_FRAMES = 768  # FPS_MAX_FRAMES
QWEN_VIDEO_MIN_TOKENS = 128  # VIDEO_MIN_TOKEN_NUM: per-frame pixel floor, in (2 * patch)^2 tokens
QWEN_VIDEO_MAX_TOKENS = 768  # VIDEO_MAX_TOKEN_NUM: per-frame pixel cap, in tokens
QWEN_MODEL_SEQ_LEN = 128_000  # MODEL_SEQ_LEN (its environment variable's default): the whole video's budget
QWEN_SPATIAL_MERGE = 2  # SPATIAL_MERGE_SIZE


class QwenVideoRule(_Spec):
    """The frame rule of the official ``qwen-omni-utils`` (``fetch_video``, v0.0.9), for inputs a real Qwen-Omni
    checkpoint was trained on: how many frames (``smart_nframes``: ``duration * fps`` clamped to
    ``[min_frames, max_frames]`` and to the frame count, rounded down to an even number), which ones (frame
    indices ``linspace(first, last, n).round()``, as its torchcodec and decord readers pick them) and their size
    (``smart_resize`` to multiples of ``2 * patch_size`` with the pixel count between ``min_pixels`` and
    ``min(max_pixels, total_pixels / n * 2)``, floored at ``1.05 * min_pixels``), resized with torchvision's
    bicubic antialiased tensor resize (:func:`relax_gym.omni.decode.resize_frames`).

    ``patch_size`` is the vision tower's (14 for Qwen2.5-Omni, 16 for Qwen3-Omni: ``process_mm_info(...,
    image_patch_size=16)``); unset pixel limits take qwen-omni-utils' defaults for that patch."""

    patch_size: int = Field(default=14, gt=0)
    min_pixels: int | None = Field(default=None, gt=0)
    max_pixels: int | None = Field(default=None, gt=0)
    total_pixels: float | None = Field(default=None, gt=0)

    @property
    def factor(self) -> int:
        return self.patch_size * QWEN_SPATIAL_MERGE

    def frame_range(self, total_frames: int, video_fps: float, start_s: float | None,
                    end_s: float | None) -> tuple[int, int, int]:
        """``calculate_video_frame_range``: (first, last, count) of the frames in ``[start_s, end_s]``."""
        if video_fps <= 0 or total_frames <= 0:
            raise ValueError(f"a video needs a positive frame rate and frame count, got {video_fps} fps, "
                             f"{total_frames} frames")
        if start_s is None and end_s is None:
            return 0, total_frames - 1, total_frames
        duration = total_frames / video_fps
        first = math.ceil(max(0.0, min(start_s, duration)) * video_fps) if start_s is not None else 0
        last = total_frames - 1
        if end_s is not None:
            last = min(math.floor(max(0.0, min(end_s, duration)) * video_fps), total_frames - 1)
        if first >= last:
            raise ValueError(f"the span [{start_s}, {end_s}] s holds frames {first}..{last} of {total_frames} "
                             f"({duration:.2f} s at {video_fps:g} fps): nothing to sample")
        return first, last, last - first + 1

    def frame_count(self, total_frames: int, video_fps: float, fps: float, min_frames: int, max_frames: int) -> int:
        """``smart_nframes`` with ``fps``, ``min_frames`` and ``max_frames`` given."""
        f = QWEN_FRAME_FACTOR
        low = math.ceil(min_frames / f) * f
        high = math.floor(max_frames / f) * f
        n = total_frames / video_fps * fps
        n = min(min(max(n, low), high), total_frames)
        n = math.floor(n / f) * f
        if not f <= n <= total_frames:
            raise ValueError(f"{total_frames} frame(s) at {video_fps:g} fps give {n} frames to sample; the Qwen rule "
                             f"needs between {f} and the frame count")
        return int(n)

    def frame_indices(self, total_frames: int, video_fps: float, fps: float, min_frames: int, max_frames: int,
                      start_s: float | None = None, end_s: float | None = None) -> tuple[list[int], float]:
        """The frame indices to decode and the ``sample_fps`` qwen-omni-utils reports for them
        (``n / frames in span * video_fps``: what the processor's ``fps`` becomes)."""
        import torch  # torch.linspace in float32 then round-half-even: the exact ties of the official rule

        first, last, count = self.frame_range(total_frames, video_fps, start_s, end_s)
        n = self.frame_count(count, video_fps, fps, min_frames, max_frames)
        idx = torch.linspace(first, last, n).round().long().tolist()
        return idx, n / max(count, 1e-6) * video_fps

    def frame_size(self, height: int, width: int, nframes: int) -> tuple[int, int]:
        """(height, width) every picked frame is resized to."""
        factor = self.factor
        min_pixels = self.min_pixels if self.min_pixels is not None else QWEN_VIDEO_MIN_TOKENS * factor * factor
        total = self.total_pixels if self.total_pixels is not None else QWEN_MODEL_SEQ_LEN * factor * factor * 0.9
        cap = max(min(QWEN_VIDEO_MAX_TOKENS * factor * factor, total / nframes * QWEN_FRAME_FACTOR),
                  int(min_pixels * 1.05))
        if self.max_pixels is not None:
            cap = min(self.max_pixels, cap)
        return qwen_smart_resize(height, width, factor, min_pixels, cap)


def qwen_smart_resize(height: int, width: int, factor: int, min_pixels: float, max_pixels: float) -> tuple[int, int]:
    """qwen-omni-utils' ``smart_resize``. Not quite transformers' own (``processor.smart_resize``): this one keeps
    each side at least ``factor`` when rounding, transformers' when shrinking; they agree on every frame size whose
    sides round to ``factor`` or more."""
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class VideoSampling(_Spec):
    """Frames are taken at ``fps`` (at most the native rate) from ``[start_s, end_s)``; if more than
    ``max_frames`` would result they are spread uniformly over the span instead. Frames are resized so that
    height*width <= ``max_pixels``. With ``audio`` set, the first audio track is decoded too.

    With ``qwen`` set, frames follow the official qwen-omni-utils rule instead (:class:`QwenVideoRule`: ``fps``,
    ``min_frames`` and ``max_frames`` as its ``smart_nframes`` reads them, pixel limits from the rule,
    ``max_pixels`` unused), and the audio track, when asked for, runs to the end of the file (qwen-omni-utils
    loads it whole from ``start_s``). :meth:`qwen_omni` gives its defaults."""

    fps: float = Field(default=2.0, gt=0.0)
    max_frames: int = Field(default=32, gt=0)
    min_frames: int = Field(default=1, gt=0)
    max_pixels: int = Field(default=256 * 256, gt=0)
    start_s: float = Field(default=0.0, ge=0.0)
    end_s: float | None = Field(default=None, gt=0.0)
    audio: AudioSampling | None = None
    qwen: QwenVideoRule | None = None

    @classmethod
    def qwen_omni(cls, *, patch_size: int = 14, audio: bool = False, **overrides) -> VideoSampling:
        """qwen-omni-utils' defaults (2 fps, 4 to 768 frames, its pixel limits for ``patch_size``); ``audio``
        decodes the track too (for ``use_audio_in_video``)."""
        fields = {"fps": 2.0, "min_frames": QWEN_FPS_MIN_FRAMES, "max_frames": QWEN_FPS_MAX_FRAMES,
                  "qwen": QwenVideoRule(patch_size=patch_size), "audio": AudioSampling() if audio else None}
        fields.update(overrides)
        return cls(**fields)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_frames > self.max_frames:
            raise ValueError(f"min_frames ({self.min_frames}) exceeds max_frames ({self.max_frames})")
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be greater than start_s ({self.start_s})")
        return self
