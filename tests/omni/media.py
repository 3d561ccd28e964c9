"""Helpers that write small media files for the omni tests (all generated at test time, never committed)."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soundfile as sf

from relax_gym.envs.synth import encode_wave

INDEX_BITS = 8
TONE_HZ = 440.0  # frequency of the AAC tone in the conftest clip_with_audio fixture


def index_frame(i: int, width: int, height: int) -> np.ndarray:
    """An RGB frame encoding ``i`` as INDEX_BITS vertical black/white stripes (bit b = stripe b), robust to
    lossy compression and to downscaling."""
    img = np.zeros((height, width, 3), np.uint8)
    for b in range(INDEX_BITS):
        if (i >> b) & 1:
            img[:, b * width // INDEX_BITS : (b + 1) * width // INDEX_BITS] = 255
    return img


def read_index(frame: np.ndarray) -> int:
    """Inverse of :func:`index_frame` (samples the centre column of each stripe)."""
    _, width, _ = frame.shape
    value = 0
    for b in range(INDEX_BITS):
        col = int((b + 0.5) * width / INDEX_BITS)
        if frame[:, col].mean() > 127:
            value |= 1 << b
    return value


def write_indexed_video(
    path: Path,
    *,
    fps: float = 30.0,
    frames: int = 90,
    width: int = 96,
    height: int = 64,
    pix_fmt: str = "yuv420p",
    faststart: bool = False,
) -> Path:
    """H.264 mp4 whose frame ``i`` shows :func:`index_frame` ``(i)``. ``faststart`` puts the index (moov) first."""
    options = {"movflags": "faststart"} if faststart else {}
    container = av.open(str(path), mode="w", format="mp4", options=options)
    stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
    stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
    stream.codec_context.thread_count = 1
    stream.options = {"preset": "veryfast", "crf": "18"}
    try:
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(index_frame(i, width, height), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    finally:
        container.close()
    return path


def tone(hz: float, seconds: float, rate: int, amp: float = 0.4) -> np.ndarray:
    t = np.arange(int(round(seconds * rate)), dtype=np.float64) / rate
    return (amp * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def peak_hz(wave: np.ndarray, rate: int) -> float:
    """Frequency of the strongest FFT bin (Hann-windowed)."""
    wave = np.asarray(wave, dtype=np.float64)
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave))))
    return float(np.fft.rfftfreq(len(wave), 1.0 / rate)[int(np.argmax(spectrum))])


def write_aac(path: Path, wave: np.ndarray, rate: int, *, channels: int = 1) -> Path:
    """An audio-only AAC file (container chosen from the suffix: .m4a / .mp4)."""
    layout = "mono" if channels == 1 else "stereo"
    container = av.open(str(path), mode="w", format="mp4")
    stream = container.add_stream("aac", rate=rate)
    stream.layout = layout
    stream.codec_context.thread_count = 1
    try:
        encode_wave(container, stream, np.tile(wave, (channels, 1)), rate)
    finally:
        container.close()
    return path


def wav_bytes(wave: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()
