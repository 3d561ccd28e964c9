"""Shared media fixtures for the omni tests. Files are written once per session into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from relax_gym.envs.synth import write_moving_square_video
from relax_gym.omni import DecodeCache

from .media import TONE_HZ, write_indexed_video


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("omni_media")


@pytest.fixture(scope="session")
def indexed_clip(media_dir: Path) -> Path:
    """30 fps, 3 s (90 frames), 96x64; frame i encodes i (see media.index_frame)."""
    return write_indexed_video(media_dir / "indexed_30fps_3s.mp4", fps=30.0, frames=90, width=96, height=64)


@pytest.fixture(scope="session")
def clip_with_audio(media_dir: Path) -> Path:
    """8 fps, 24 frames (3 s), 64x64, with a 440 Hz AAC mono tone."""
    path = media_dir / "square_tone.mp4"
    write_moving_square_video(path, "right", fps=8.0, frames=24, with_audio_hz=TONE_HZ)
    return path


@pytest.fixture(scope="session")
def silent_clip(media_dir: Path) -> Path:
    """8 fps, 16 frames (2 s), 64x64, no audio track."""
    path = media_dir / "square_silent.mp4"
    write_moving_square_video(path, "left", fps=8.0, frames=16)
    return path


@pytest.fixture
def cache() -> DecodeCache:
    return DecodeCache(64 * 1024 * 1024)
