"""Property tests (hypothesis) of the pure helpers: fit_pixels and sample_times."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from relax_gym.omni import VideoSampling
from relax_gym.omni.decode import fit_pixels, sample_times

dims = st.integers(min_value=1, max_value=8_192)


@settings(max_examples=400, deadline=None, database=None)
@given(width=dims, height=dims, max_pixels=st.integers(min_value=1, max_value=4_000_000))
def test_fit_pixels_invariants(width: int, height: int, max_pixels: int) -> None:
    w, h = fit_pixels(width, height, max_pixels)
    assert isinstance(w, int) and isinstance(h, int)
    assert w >= 1 and h >= 1
    assert w <= width and h <= height  # never upscales
    if width * height <= max_pixels:
        assert (w, h) == (width, height)  # untouched when it already fits
        return
    assert w * h <= max_pixels
    scale = math.sqrt(max_pixels / (width * height))
    if width * scale >= 2 and height * scale >= 2:  # no side clamped at 1 px: aspect kept up to rounding
        assert abs(w * height - h * width) <= 2 * max(width, height)
        assert (w + 2) * (h + 2) > max_pixels  # and not much smaller than allowed


@settings(max_examples=400, deadline=None, database=None)
@given(
    start=st.floats(min_value=0.0, max_value=100.0),
    length=st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=100.0)),
    fps=st.floats(min_value=0.01, max_value=120.0),
    native=st.sampled_from([0.0, 1.0, 8.0, 12.5, 23.976, 25.0, 29.97, 30.0, 60.0]),
    max_frames=st.integers(min_value=1, max_value=64),
    min_frames=st.integers(min_value=1, max_value=64),
)
def test_sample_times_invariants(start: float, length: float, fps: float, native: float, max_frames: int, min_frames: int) -> None:
    assume(min_frames <= max_frames)
    spec = VideoSampling(fps=fps, max_frames=max_frames, min_frames=min_frames)
    end = start + length
    times = sample_times(start, end, spec, native)
    n = len(times)
    assert 1 <= n <= max_frames
    assert np.all(times >= start) and np.all(times <= end)
    assert np.all(np.diff(times) >= 0)
    if length > 0:
        assert np.all(times > start) and np.all(times < end)
        assert np.all(np.diff(times) > 0)
        np.testing.assert_allclose(np.diff(times), length / n, rtol=1e-6, atol=1e-9)  # uniform spread
    span = end - start  # what the function sees (may differ from ``length`` in the last bit)
    effective = min(fps, native) if native > 0 else fps
    by_fps = math.floor(span * effective + 1e-9)
    if native > 0:
        held = max(1, round(span * native))  # frames the span holds at the native rate
        assert n <= held  # never more frames than the span holds
        assert n >= min(max_frames, max(min_frames, by_fps), held)
    else:
        assert n >= min(max_frames, max(min_frames, by_fps))
    assert n <= max(1, min_frames, by_fps)  # no more than fps (or min_frames) asks


def test_sample_times_examples() -> None:
    np.testing.assert_allclose(sample_times(0.0, 3.0, VideoSampling(fps=2.0), 30.0), [0.25, 0.75, 1.25, 1.75, 2.25, 2.75])
    np.testing.assert_allclose(sample_times(1.0, 2.0, VideoSampling(fps=4.0), 30.0), [1.125, 1.375, 1.625, 1.875])
    np.testing.assert_allclose(sample_times(0.0, 3.0, VideoSampling(fps=30.0, max_frames=3), 30.0), [0.5, 1.5, 2.5])
    np.testing.assert_allclose(sample_times(0.0, 1.0, VideoSampling(fps=100.0, max_frames=100), 4.0), [0.125, 0.375, 0.625, 0.875])
    np.testing.assert_allclose(sample_times(0.0, 3.0, VideoSampling(fps=0.5, min_frames=4), 30.0), [0.375, 1.125, 1.875, 2.625])


def test_fit_pixels_examples() -> None:
    assert fit_pixels(96, 64, 10_000) == (96, 64)
    assert fit_pixels(96, 64, 96 * 64) == (96, 64)
    assert fit_pixels(64, 64, 256) == (16, 16)
    assert fit_pixels(200, 100, 5_000) == (100, 50)
    assert fit_pixels(10_000, 1, 100) == (100, 1)
    assert fit_pixels(5, 5, 1) == (1, 1)
