"""Conversation building blocks: messages whose content is a list of parts (text, image, video, audio).

Media parts are lazy: they hold a :class:`MediaSource` and a sampling spec, and decode (through the shared
cache) only when ``decode()`` is called. Equality of media parts is by source and spec, so two resets with
the same seed give equal observations without decoding anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from relax_gym.omni import decode as _dec
from relax_gym.omni.cache import DecodeCache, default_cache
from relax_gym.omni.sampling import AudioSampling, ImageSampling, VideoSampling
from relax_gym.omni.source import MediaSource

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class TextPart:
    text: str
    kind: ClassVar[str] = "text"

    def summary(self) -> str:
        return self.text


@dataclass(frozen=True)
class ImagePart:
    source: MediaSource
    sampling: ImageSampling = field(default_factory=ImageSampling)
    kind: ClassVar[str] = "image"

    @classmethod
    def of(cls, value: str | os.PathLike | bytes | np.ndarray | MediaSource, *, mime: str | None = None, **sampling: Any) -> ImagePart:
        return cls(MediaSource.of(value, mime=mime), ImageSampling(**sampling))

    @property
    def content_hash(self) -> str:
        return self.source.content_hash

    def decode(self, cache: DecodeCache | None = default_cache) -> np.ndarray:
        """uint8 (H, W, 3)."""

        def run() -> np.ndarray:
            if self.source.array is not None:
                return _dec.image_from_array(self.source.array, self.sampling, name=self.source.name)
            return _dec.decode_image(self.source.raw(), self.sampling, name=self.source.name)

        return _cached(cache, self.source, self.sampling.cache_key(), run, lambda a: a.nbytes)

    def summary(self) -> str:
        h, w, _ = self.decode().shape
        return f"[image {w}x{h} {self.source.name}]"


@dataclass(frozen=True)
class VideoPart:
    source: MediaSource
    sampling: VideoSampling = field(default_factory=VideoSampling)
    kind: ClassVar[str] = "video"

    @classmethod
    def of(cls, value: str | os.PathLike | bytes | np.ndarray | MediaSource, *, fps_of_array: float | None = None, mime: str | None = None, **sampling: Any) -> VideoPart:
        if isinstance(value, np.ndarray) and fps_of_array is None:
            raise ValueError("a video array needs fps_of_array= (its frame rate)")
        return cls(MediaSource.of(value, rate=fps_of_array, mime=mime), VideoSampling(**sampling))

    @property
    def content_hash(self) -> str:
        return self.source.content_hash

    def decode(self, cache: DecodeCache | None = default_cache) -> _dec.DecodedVideo:
        """Frames uint8 (T, H, W, 3) and their timestamps; ``audio`` too when the spec asks for the track."""

        def run() -> _dec.DecodedVideo:
            if self.source.array is not None:
                return _dec.video_from_array(self.source.array, float(self.source.rate), self.sampling, name=self.source.name)
            return _dec.decode_video(self.source.raw(), self.sampling, name=self.source.name)

        return _cached(cache, self.source, self.sampling.cache_key(), run, lambda v: v.nbytes)

    def summary(self) -> str:
        v = self.decode()
        t, h, w, _ = v.frames.shape
        span = f"{v.timestamps[0]:.2f}-{v.timestamps[-1]:.2f}s" if t else "empty"
        audio = f", audio {v.audio.duration_s:.2f}s@{v.audio.sample_rate}Hz" if v.audio else ""
        return f"[video {t} frames {w}x{h} ({span} of {v.duration_s:.2f}s, native {v.native_fps:.1f} fps){audio} {self.source.name}]"


@dataclass(frozen=True)
class AudioPart:
    source: MediaSource
    sampling: AudioSampling = field(default_factory=AudioSampling)
    kind: ClassVar[str] = "audio"

    @classmethod
    def of(cls, value: str | os.PathLike | bytes | np.ndarray | MediaSource, *, rate_of_array: float | None = None, mime: str | None = None, **sampling: Any) -> AudioPart:
        if isinstance(value, np.ndarray) and rate_of_array is None:
            raise ValueError("an audio array needs rate_of_array= (its sample rate)")
        return cls(MediaSource.of(value, rate=rate_of_array, mime=mime), AudioSampling(**sampling))

    @property
    def content_hash(self) -> str:
        return self.source.content_hash

    def decode(self, cache: DecodeCache | None = default_cache) -> _dec.DecodedAudio:
        """float32 mono waveform (N,) at ``sampling.sample_rate``."""

        def run() -> _dec.DecodedAudio:
            if self.source.array is not None:
                return _dec.audio_from_array(self.source.array, float(self.source.rate), self.sampling, name=self.source.name)
            return _dec.decode_audio(self.source.raw(), self.sampling, name=self.source.name)

        return _cached(cache, self.source, self.sampling.cache_key(), run, lambda a: a.nbytes)

    def summary(self) -> str:
        a = self.decode()
        s = self.sampling
        span = f", {s.start_s:.2f}-{s.start_s + a.duration_s:.2f}s of the source" if s.start_s > 0 or s.end_s is not None else ""
        return f"[audio {a.duration_s:.2f}s @ {a.sample_rate} Hz, {len(a.waveform)} samples{span} {self.source.name}]"


Part = TextPart | ImagePart | VideoPart | AudioPart
MediaPart = ImagePart | VideoPart | AudioPart
MEDIA_KINDS: tuple[str, ...] = ("image", "video", "audio")


@dataclass(frozen=True)
class Message:
    role: Role
    content: tuple[Part, ...]
    name: str | None = None
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {self.role!r}")
        if isinstance(self.content, str):
            object.__setattr__(self, "content", (TextPart(self.content),))
        else:
            object.__setattr__(self, "content", tuple(self.content))
        for i, part in enumerate(self.content):
            if not isinstance(part, PART_TYPES):
                raise TypeError(f"{self.role} message, content[{i}]: a {type(part).__module__}.{type(part).__name__} is "
                                f"not a part; wrap text in TextPart(...) and media with ImagePart.of(...), "
                                f"VideoPart.of(frames, fps_of_array=...) or AudioPart.of(wave, rate_of_array=...)")

    @property
    def text(self) -> str:
        """The message's text parts joined (media parts left out)."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def media(self) -> list[MediaPart]:
        return [p for p in self.content if not isinstance(p, TextPart)]


PART_TYPES = (TextPart, ImagePart, VideoPart, AudioPart)


def media_parts(messages: list[Message] | tuple[Message, ...]) -> list[MediaPart]:
    return [p for m in messages for p in m.media()]


def _cached(cache: DecodeCache | None, source: MediaSource, spec_key: str, run, size):
    if cache is None:
        return run()
    return cache.get_or_decode(source.content_hash, spec_key, run, size)
