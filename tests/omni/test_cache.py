"""DecodeCache: hits, misses, keys (content hash + spec), LRU byte budget, read-only results, bypass."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from relax_gym.omni import AudioPart, AudioSampling, DecodeCache, ImagePart, VideoPart, default_cache
from relax_gym.omni import cache as cache_mod

from .media import tone


def _png(path: Path, seed: int, size: tuple[int, int] = (32, 16)) -> Path:
    w, h = size
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def test_second_decode_is_a_hit(tmp_path: Path, cache: DecodeCache) -> None:
    part = ImagePart.of(_png(tmp_path / "a.png", 0))
    first = part.decode(cache=cache)
    s = cache.stats()
    assert (s.hits, s.misses, s.entries, s.bytes) == (0, 1, 1, first.nbytes)
    second = ImagePart.of(tmp_path / "a.png").decode(cache=cache)  # a new, equal part
    assert second is first
    s = cache.stats()
    assert (s.hits, s.misses, s.entries) == (1, 1, 1)


def test_video_and_audio_parts_hit_too(clip_with_audio: Path, cache: DecodeCache) -> None:
    v1 = VideoPart.of(clip_with_audio, fps=2.0, audio=AudioSampling()).decode(cache=cache)
    v2 = VideoPart.of(clip_with_audio, fps=2.0, audio=AudioSampling()).decode(cache=cache)
    assert v2 is v1
    a1 = AudioPart.of(clip_with_audio).decode(cache=cache)
    a2 = AudioPart.of(clip_with_audio).decode(cache=cache)
    assert a2 is a1
    s = cache.stats()
    assert (s.hits, s.misses, s.entries) == (2, 2, 2)
    assert s.bytes == v1.nbytes + a1.nbytes


def test_same_content_other_path_hits(tmp_path: Path, cache: DecodeCache) -> None:
    a = _png(tmp_path / "a.png", 0)
    b = tmp_path / "sub" / "copy of a.png"
    b.parent.mkdir()
    shutil.copyfile(a, b)
    first = ImagePart.of(a).decode(cache=cache)
    second = ImagePart.of(b).decode(cache=cache)
    assert second is first
    assert ImagePart.of(a).content_hash == ImagePart.of(b).content_hash
    assert cache.stats().hits == 1
    third = ImagePart.of(a.read_bytes()).decode(cache=cache)  # same bytes in memory
    assert third is first


def test_different_sampling_is_a_miss(tmp_path: Path, cache: DecodeCache) -> None:
    path = _png(tmp_path / "a.png", 0, size=(64, 64))
    big = ImagePart.of(path).decode(cache=cache)
    small = ImagePart.of(path, max_pixels=256).decode(cache=cache)
    assert big.shape == (64, 64, 3) and small.shape == (16, 16, 3)
    s = cache.stats()
    assert (s.hits, s.misses, s.entries) == (0, 2, 2)


def test_different_content_is_a_miss(tmp_path: Path, cache: DecodeCache) -> None:
    a = ImagePart.of(_png(tmp_path / "a.png", 0)).decode(cache=cache)
    b = ImagePart.of(_png(tmp_path / "b.png", 1)).decode(cache=cache)
    assert not np.array_equal(a, b)
    assert cache.stats().misses == 2


def test_byte_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    paths = [_png(tmp_path / f"{k}.png", k) for k in range(3)]
    one = 32 * 16 * 3
    cache = DecodeCache(2 * one)
    a = ImagePart.of(paths[0]).decode(cache=cache)
    ImagePart.of(paths[1]).decode(cache=cache)
    assert ImagePart.of(paths[0]).decode(cache=cache) is a  # touch a: b is now least recently used
    ImagePart.of(paths[2]).decode(cache=cache)  # over budget: evicts b
    s = cache.stats()
    assert (s.entries, s.evictions, s.bytes) == (2, 1, 2 * one)
    assert s.bytes <= cache.max_bytes
    misses = s.misses
    assert ImagePart.of(paths[0]).decode(cache=cache) is a  # still there
    assert cache.stats().misses == misses
    ImagePart.of(paths[1]).decode(cache=cache)  # was evicted: decoded again
    assert cache.stats().misses == misses + 1
    assert cache.stats().bytes <= cache.max_bytes


def test_item_larger_than_budget_is_not_kept(tmp_path: Path) -> None:
    cache = DecodeCache(100)
    path = _png(tmp_path / "a.png", 0)
    first = ImagePart.of(path).decode(cache=cache)
    second = ImagePart.of(path).decode(cache=cache)
    assert second is not first
    np.testing.assert_array_equal(first, second)
    s = cache.stats()
    assert (s.entries, s.bytes, s.hits, s.misses) == (0, 0, 0, 2)


def test_zero_budget_disables_caching(tmp_path: Path) -> None:
    cache = DecodeCache(0)
    path = _png(tmp_path / "a.png", 0)
    ImagePart.of(path).decode(cache=cache)
    ImagePart.of(path).decode(cache=cache)
    assert cache.stats().hits == 0 and cache.stats().entries == 0


def test_clear(tmp_path: Path, cache: DecodeCache) -> None:
    path = _png(tmp_path / "a.png", 0)
    ImagePart.of(path).decode(cache=cache)
    cache.clear()
    s = cache.stats()
    assert (s.entries, s.bytes) == (0, 0)
    ImagePart.of(path).decode(cache=cache)
    assert cache.stats().misses == 2


def test_returned_arrays_are_read_only(tmp_path: Path, clip_with_audio: Path, cache: DecodeCache) -> None:
    img = ImagePart.of(_png(tmp_path / "a.png", 0)).decode(cache=cache)
    video = VideoPart.of(clip_with_audio, audio=AudioSampling()).decode(cache=cache)
    sf.write(tmp_path / "t.wav", tone(440.0, 0.5, 16_000), 16_000)
    audio = AudioPart.of(tmp_path / "t.wav").decode(cache=cache)
    arrays = [img, video.frames, video.timestamps, video.audio.waveform, audio.waveform]
    for arr in arrays:
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr.reshape(-1)[0] = 1
    with pytest.raises(ValueError):
        img[...] = 0
    # and the cached copy is unchanged
    np.testing.assert_array_equal(ImagePart.of(tmp_path / "a.png").decode(cache=cache), img)


def test_uncached_arrays_are_read_only_too(tmp_path: Path) -> None:
    img = ImagePart.of(_png(tmp_path / "a.png", 0)).decode(cache=None)
    with pytest.raises(ValueError):
        img[0, 0, 0] = 1


def test_cache_none_bypasses(tmp_path: Path, cache: DecodeCache) -> None:
    path = _png(tmp_path / "bypass.png", 7)
    part = ImagePart.of(path)
    before = default_cache.stats()
    first = part.decode(cache=None)
    second = part.decode(cache=None)
    after = default_cache.stats()
    assert second is not first
    np.testing.assert_array_equal(first, second)
    assert (after.hits, after.misses) == (before.hits, before.misses)
    assert cache.stats().misses == 0


def test_default_cache_is_used_by_default(tmp_path: Path) -> None:
    path = _png(tmp_path / "default.png", 11, size=(8, 8))
    before = default_cache.stats()
    first = ImagePart.of(path).decode()
    second = ImagePart.of(path).decode()
    after = default_cache.stats()
    assert second is first
    assert after.misses == before.misses + 1
    assert after.hits == before.hits + 1
    assert ImagePart.of(path).decode(cache=default_cache) is first


def test_array_parts_hit_by_content(cache: DecodeCache) -> None:
    frames = np.random.default_rng(0).integers(0, 256, (8, 16, 16, 3), dtype=np.uint8)
    v1 = VideoPart.of(frames, fps_of_array=4.0).decode(cache=cache)
    v2 = VideoPart.of(frames.copy(), fps_of_array=4.0).decode(cache=cache)
    assert v2 is v1
    v3 = VideoPart.of(frames, fps_of_array=8.0).decode(cache=cache)  # other rate, other content hash
    assert v3 is not v1
    assert v3.duration_s == pytest.approx(1.0) and v1.duration_s == pytest.approx(2.0)


def test_concurrent_decodes_agree(tmp_path: Path, cache: DecodeCache) -> None:
    path = _png(tmp_path / "a.png", 0, size=(64, 48))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: ImagePart.of(path).decode(cache=cache), range(16)))
    for r in results:
        np.testing.assert_array_equal(r, results[0])
    s = cache.stats()
    assert s.entries == 1 and s.bytes == results[0].nbytes
    assert s.hits + s.misses == 16


def test_budget_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAX_GYM_DECODE_CACHE_MB", raising=False)
    assert cache_mod._budget_from_env() == 1024 * 1024 * 1024
    monkeypatch.setenv("RELAX_GYM_DECODE_CACHE_MB", "0.5")
    assert cache_mod._budget_from_env() == 512 * 1024
    monkeypatch.setenv("RELAX_GYM_DECODE_CACHE_MB", "0")
    assert cache_mod._budget_from_env() == 0
    monkeypatch.setenv("RELAX_GYM_DECODE_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="RELAX_GYM_DECODE_CACHE_MB"):
        cache_mod._budget_from_env()


def test_get_or_decode_directly() -> None:
    cache = DecodeCache(1_000)
    calls = []

    def decode(value: bytes) -> bytes:
        calls.append(value)
        return value

    assert cache.get_or_decode("h1", "spec", lambda: decode(b"x" * 10), len) == b"x" * 10
    assert cache.get_or_decode("h1", "spec", lambda: decode(b"never"), len) == b"x" * 10
    assert cache.get_or_decode("h1", "other", lambda: decode(b"y" * 10), len) == b"y" * 10
    assert calls == [b"x" * 10, b"y" * 10]
    for k in range(200):
        cache.get_or_decode(f"h{k + 2}", "spec", lambda: b"z" * 10, len)
    s = cache.stats()
    assert s.bytes <= 1_000 and s.entries == 100 and s.evictions == 102
