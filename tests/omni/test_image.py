"""Image decoding through Pillow: formats, colour modes, pixel budget."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from relax_gym.omni import ImagePart, ImageSampling, MediaError
from relax_gym.omni.decode import decode_image


def _rgb(width: int = 40, height: int = 30, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def _smooth_rgb(width: int = 64, height: int = 48) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x + y) * 255 // (width + height - 2)], -1).astype(np.uint8)


def test_png_rgb_is_exact(tmp_path: Path) -> None:
    rgb = _rgb()
    Image.fromarray(rgb).save(tmp_path / "a.png")
    out = ImagePart.of(tmp_path / "a.png").decode(cache=None)
    assert out.dtype == np.uint8 and out.shape == (30, 40, 3)
    np.testing.assert_array_equal(out, rgb)
    assert not out.flags.writeable


def test_jpeg(tmp_path: Path) -> None:
    rgb = _smooth_rgb()
    Image.fromarray(rgb).save(tmp_path / "a.jpg", quality=95)
    out = ImagePart.of(tmp_path / "a.jpg").decode(cache=None)
    assert out.dtype == np.uint8 and out.shape == (48, 64, 3)
    assert np.abs(out.astype(int) - rgb.astype(int)).mean() < 4


def test_rgba_png_becomes_rgb(tmp_path: Path) -> None:
    rgb = _rgb(seed=1)
    alpha = np.full(rgb.shape[:2] + (1,), 128, np.uint8)
    Image.fromarray(np.concatenate([rgb, alpha], -1), mode="RGBA").save(tmp_path / "rgba.png")
    out = ImagePart.of(tmp_path / "rgba.png").decode(cache=None)
    assert out.shape == (30, 40, 3) and out.dtype == np.uint8
    # laid on white through its alpha, as qwen-omni-utils' fetch_image does (128/255 of the pixel, the rest white)
    expected = rgb.astype(np.float64) * (128 / 255) + 255 * (127 / 255)
    assert np.abs(out.astype(np.float64) - expected).max() <= 1.0


@pytest.mark.parametrize("mode", ["L", "LA", "P", "1"])
def test_grayscale_and_palette_become_rgb(tmp_path: Path, mode: str) -> None:
    gray = np.tile(np.arange(0, 256, 8, dtype=np.uint8), (20, 1))  # 20 x 32
    img = Image.fromarray(gray, mode="L")
    if mode != "L":
        img = img.convert(mode)
    img.save(tmp_path / "g.png")
    out = ImagePart.of(tmp_path / "g.png").decode(cache=None)
    assert out.shape == (20, 32, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[..., 0], out[..., 1])
    np.testing.assert_array_equal(out[..., 0], out[..., 2])
    if mode in ("L", "LA"):
        np.testing.assert_array_equal(out[..., 0], gray)


def test_grayscale_jpeg(tmp_path: Path) -> None:
    gray = np.tile(np.linspace(0, 255, 50).astype(np.uint8), (30, 1))
    Image.fromarray(gray, mode="L").save(tmp_path / "g.jpg", quality=95)
    out = ImagePart.of(tmp_path / "g.jpg").decode(cache=None)
    assert out.shape == (30, 50, 3)
    assert np.abs(out[..., 1].astype(int) - gray.astype(int)).max() <= 6


@pytest.mark.parametrize("size,max_pixels", [((200, 100), 5000), ((101, 333), 1234), ((64, 48), 64 * 48 - 1), ((7, 5), 1)])
def test_max_pixels_downsizes_keeping_aspect(tmp_path: Path, size: tuple[int, int], max_pixels: int) -> None:
    w0, h0 = size
    Image.fromarray(_rgb(w0, h0)).save(tmp_path / "big.png")
    out = ImagePart.of(tmp_path / "big.png", max_pixels=max_pixels).decode(cache=None)
    h, w, c = out.shape
    assert c == 3 and out.dtype == np.uint8
    assert h * w <= max_pixels
    assert h <= h0 and w <= w0
    assert abs(w * h0 - h * w0) <= 2 * max(w0, h0)  # aspect within a pixel of rounding


def test_max_pixels_resize_is_a_resize_not_a_crop(tmp_path: Path) -> None:
    rgb = _smooth_rgb(128, 96)
    Image.fromarray(rgb).save(tmp_path / "grad.png")
    out = ImagePart.of(tmp_path / "grad.png", max_pixels=32 * 24).decode(cache=None)
    assert out.shape == (24, 32, 3)
    # a gradient keeps its corners: top-left dark, bottom-right bright in every channel
    assert out[0, 0].max() < 30 and out[-1, -1].min() > 225


def test_max_pixels_never_upscales(tmp_path: Path) -> None:
    rgb = _rgb(10, 6)
    Image.fromarray(rgb).save(tmp_path / "tiny.png")
    out = ImagePart.of(tmp_path / "tiny.png", max_pixels=10**7).decode(cache=None)
    np.testing.assert_array_equal(out, rgb)


def test_bytes_source(tmp_path: Path) -> None:
    rgb = _rgb(seed=3)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    out = ImagePart.of(buf.getvalue(), mime="image/png").decode(cache=None)
    np.testing.assert_array_equal(out, rgb)
    np.testing.assert_array_equal(decode_image(buf.getvalue(), ImageSampling()), rgb)


def test_array_source() -> None:
    rgb = _rgb(seed=4)
    out = ImagePart.of(rgb).decode(cache=None)
    np.testing.assert_array_equal(out, rgb)
    assert not out.flags.writeable
    assert rgb.flags.writeable  # the caller's array is left alone
    small = ImagePart.of(_rgb(100, 50), max_pixels=200).decode(cache=None)
    assert small.shape[0] * small.shape[1] <= 200


@pytest.mark.parametrize("array", [np.zeros((8, 8), np.uint8), np.zeros((8, 8, 4), np.uint8), np.zeros((8, 8, 3), np.float32)])
def test_array_source_wrong_layout_raises(array: np.ndarray) -> None:
    with pytest.raises(MediaError, match="uint8"):
        ImagePart.of(array).decode(cache=None)
