"""Sampling specs: how a media part is turned into arrays (frame rate, frame budget, pixel budget, audio rate).

Specs are frozen pydantic models so they hash and serialise; the decode cache keys on ``(content hash, spec)``.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def cache_key(self) -> str:
        return f"{type(self).__name__}:{self.model_dump_json()}"


class ImageSampling(_Spec):
    """Images are resized (aspect kept) so that height*width <= ``max_pixels``; never upscaled."""

    max_pixels: int = Field(default=512 * 512, gt=0)


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


class VideoSampling(_Spec):
    """Frames are taken at ``fps`` (at most the native rate) from ``[start_s, end_s)``; if more than
    ``max_frames`` would result they are spread uniformly over the span instead. Frames are resized so that
    height*width <= ``max_pixels``. With ``audio`` set, the first audio track is decoded too."""

    fps: float = Field(default=2.0, gt=0.0)
    max_frames: int = Field(default=32, gt=0)
    min_frames: int = Field(default=1, gt=0)
    max_pixels: int = Field(default=256 * 256, gt=0)
    start_s: float = Field(default=0.0, ge=0.0)
    end_s: float | None = Field(default=None, gt=0.0)
    audio: AudioSampling | None = None

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_frames > self.max_frames:
            raise ValueError(f"min_frames ({self.min_frames}) exceeds max_frames ({self.max_frames})")
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be greater than start_s ({self.start_s})")
        return self
